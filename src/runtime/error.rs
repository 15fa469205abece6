//! The runtime's errors.

use std::time::Duration;

use tensorferry_core::handshake::coordinator::ConfigError;
use tensorferry_core::handshake::instance::InstanceError;
use tensorferry_core::handshake::LimitsError;
use tensorferry_core::json::JsonError;
use tensorferry_core::slots::{BuddyError, LayoutError};
use tensorferry_core::transport::FaultKind;

/// Why a node could not start or a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The instance refused the call or its settings.
    #[error("instance: {0}")]
    Instance(#[from] InstanceError),
    /// Pool settings the allocator cannot take.
    #[error("pool settings: {0}")]
    Pool(BuddyError),
    /// Coordinator settings it cannot take.
    #[error("coordinator settings: {0}")]
    Coordinator(ConfigError),
    /// Table sizes out of range.
    #[error("table sizes: {0}")]
    Limits(#[from] LimitsError),
    /// An entry of the admission list it cannot take.
    #[error("admitting {endpoint} as {role}: {source}")]
    Admission {
        /// The role.
        role: String,
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: ConfigError,
    },
    /// The data plane (or the control channel a node binds) failed.
    #[error("data plane {verb}: {source}")]
    Transport {
        /// What was being done.
        verb: &'static str,
        /// What kind of failure it is, as the backend says.
        kind: FaultKind,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The data plane holds no pool to receive into (a transport opened
    /// without one).
    #[error("the data plane has no pool of its own")]
    NoPool,
    /// The pool a node maps for a transport that owns none
    /// ([`InstanceNode::start_with_pool`](super::InstanceNode::start_with_pool))
    /// could not be mapped.
    #[error("mapping a pool of {len} bytes: {source}")]
    MapPool {
        /// The pool's length asked for.
        len: usize,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The tensors cannot be laid out in a slot.
    #[error("tensor layout: {0}")]
    Layout(LayoutError),
    /// More tensors than one request may carry.
    #[error("{count} tensors in one request; at most {max}")]
    TooManyTensors {
        /// Tensors given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Scalar fields that are not one JSON object.
    #[error("scalar fields are not a JSON object: {0}")]
    ScalarFields(JsonError),
    /// The progress thread could not be started.
    #[error("starting the progress thread: {0}")]
    Thread(std::io::Error),
    /// The coordinator did not acknowledge the registration in time.
    #[error("not registered with the coordinator within {0:?}")]
    NotRegistered(Duration),
    /// Something awaited did not happen in time.
    #[error("{what} did not happen within {after:?}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long it was awaited.
        after: Duration,
    },
    /// The coordinator refused the registration, for the reason it gave.
    #[error("the coordinator refused the registration: {reason}")]
    Refused {
        /// The coordinator's words (`unknown role`, ...).
        reason: String,
    },
    /// A delivery of another node was passed to this node's call.
    #[error("the delivery was received by another node")]
    ForeignDelivery,
    /// The node's progress thread stopped (it panicked): it stages and
    /// delivers nothing more. Release what is held and drop the node.
    #[error("the node's progress thread stopped; it takes no more work")]
    Stopped,
    /// The control channel did not take the application's message.
    #[error("sending to {to}: {source}")]
    Send {
        /// The endpoint.
        to: String,
        /// What kind of failure it is (the coordinator gone, a full queue).
        kind: FaultKind,
        /// The channel's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What kind of failure a node's error is ([`NodeError::kind`]): a data
/// plane's fault kind, or one of the calls around the data plane. Python's
/// exception classes and `FerryError.kind` are these, by [`name`](Self::name);
/// Python gives an engine's errors the same kinds (the fault kind of
/// `EngineError::kind`, or `closed` for an engine used after its close).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A data plane's kind of failure (the core's table; a node's timeouts
    /// and requests too large are these too).
    Fault(FaultKind),
    /// The coordinator refused the instance's registration.
    Refused,
    /// The instance drains or has left: it takes no new request.
    Draining,
    /// The engine, node, staging or delivery is closed or used up.
    Closed,
    /// The pool or the request table has no room now (try again later).
    NoRoom,
}

impl ErrorKind {
    /// The kinds beside the core's fault kinds, in the order Python lists
    /// them after those.
    pub const OWN: [ErrorKind; 4] = [Self::Refused, Self::Draining, Self::Closed, Self::NoRoom];

    /// Its name: the fault kind's ([`FaultKind::as_name`]) or `refused`,
    /// `draining`, `closed`, `no_room`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fault(k) => k.as_name(),
            Self::Refused => "refused",
            Self::Draining => "draining",
            Self::Closed => "closed",
            Self::NoRoom => "no_room",
        }
    }
}

impl NodeError {
    /// What kind of failure this is: what a caller decides on (retry when
    /// there is no room, stop when refused or closed) without reading the
    /// message.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Refused { .. } => ErrorKind::Refused,
            Self::NotRegistered(_) | Self::Timeout { .. } => ErrorKind::Fault(FaultKind::Timeout),
            Self::Instance(i) => match i {
                InstanceError::Draining => ErrorKind::Draining,
                InstanceError::TableFull | InstanceError::Pool(BuddyError::OutOfSpace { .. }) => {
                    ErrorKind::NoRoom
                }
                InstanceError::TooLarge | InstanceError::Pool(BuddyError::TooLarge { .. }) => {
                    ErrorKind::Fault(FaultKind::TooLarge)
                }
                _ => ErrorKind::Fault(FaultKind::Io),
            },
            Self::TooManyTensors { .. } => ErrorKind::Fault(FaultKind::TooLarge),
            Self::Send { kind, .. } | Self::Transport { kind, .. } => ErrorKind::Fault(*kind),
            Self::Stopped => ErrorKind::Closed,
            _ => ErrorKind::Fault(FaultKind::Io),
        }
    }

    /// A backend's failure while doing `verb`, of the kind its trait's
    /// `fault_kind` (or its own `kind`) says.
    pub fn transport<E>(verb: &'static str, kind: FaultKind, e: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::Transport {
            verb,
            kind,
            source: Box::new(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_says_the_kind_a_caller_decides_on() {
        let refused = NodeError::Refused {
            reason: "unknown role".into(),
        };
        assert_eq!(refused.kind(), ErrorKind::Refused);
        assert_eq!(
            NodeError::Instance(InstanceError::Draining).kind(),
            ErrorKind::Draining
        );
        assert_eq!(
            NodeError::Instance(InstanceError::TableFull).kind(),
            ErrorKind::NoRoom
        );
        assert_eq!(NodeError::Stopped.kind(), ErrorKind::Closed);
        assert_eq!(
            NodeError::NotRegistered(Duration::from_secs(1)).kind(),
            ErrorKind::Fault(FaultKind::Timeout)
        );
        assert_eq!(
            NodeError::TooManyTensors { count: 33, max: 32 }.kind(),
            ErrorKind::Fault(FaultKind::TooLarge)
        );
        let send = NodeError::Send {
            to: "tcp://10.0.0.1:5555".into(),
            kind: FaultKind::PeerGone,
            source: "gone".into(),
        };
        assert_eq!(send.kind(), ErrorKind::Fault(FaultKind::PeerGone));
        assert_eq!(
            NodeError::ForeignDelivery.kind(),
            ErrorKind::Fault(FaultKind::Io)
        );
    }

    #[test]
    fn names_are_the_fault_kinds_then_the_nodes_own_each_once() {
        let names: Vec<&str> = FaultKind::ALL
            .into_iter()
            .map(ErrorKind::Fault)
            .chain(ErrorKind::OWN)
            .map(ErrorKind::name)
            .collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(
            &names[names.len() - 4..],
            ["refused", "draining", "closed", "no_room"]
        );
    }
}
