//! The runtime's errors.

use std::time::Duration;

use tensorferry_core::handshake::coordinator::ConfigError;
use tensorferry_core::handshake::instance::InstanceError;
use tensorferry_core::handshake::LimitsError;
use tensorferry_core::json::JsonError;
use tensorferry_core::slots::{BuddyError, LayoutError};

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
        kind: tensorferry_core::transport::FaultKind,
        /// The backend's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The data plane holds no pool to receive into (a transport opened
    /// without one).
    #[error("the data plane has no pool of its own")]
    NoPool,
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
        kind: tensorferry_core::transport::FaultKind,
        /// The channel's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl NodeError {
    /// A backend's failure while doing `verb`, with its kind.
    pub fn transport<E>(verb: &'static str, e: E) -> Self
    where
        E: tensorferry_core::transport::Fault + Send + Sync + 'static,
    {
        Self::Transport {
            verb,
            kind: e.kind(),
            source: Box::new(e),
        }
    }
}
