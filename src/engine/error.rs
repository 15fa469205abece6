//! The engine's errors.

use std::time::Duration;

use tensorferry_core::transport::{FaultKind, OutsideOwnRegions};
use tensorferry_local::LocalError;

/// An engine's error: what failed, with the peer, address or call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// From the local engine, while opening it.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// From a data plane's transport.
    #[error("{verb}: {message}")]
    Transport {
        /// What was being done.
        verb: &'static str,
        /// The transport's error, as it says it.
        message: String,
        /// Its kind.
        kind: FaultKind,
    },
    /// A write's source or a read's destination outside every region
    /// this engine registered.
    #[error(transparent)]
    OutsideOwn(#[from] OutsideOwnRegions),
    /// `deregister` of an address no region starts at.
    #[error("deregister {addr:#x}: no registered region starts there")]
    NotRegistered {
        /// The address.
        addr: u64,
    },
    /// Writes not finished in time.
    #[error(
        "transfer with {session}: {pending} of {total} operations not finished after {waited:?}"
    )]
    Timeout {
        /// The peer's session id.
        session: String,
        /// Writes still running.
        pending: usize,
        /// Writes in the transfer.
        total: usize,
        /// How long was waited.
        waited: Duration,
    },
    /// The batch's lists have different lengths.
    #[error("a batch of {sources} sources, {dests} destinations and {lengths} lengths")]
    BatchShape {
        /// Sources given.
        sources: usize,
        /// Destinations given.
        dests: usize,
        /// Lengths given.
        lengths: usize,
    },
    /// The engine was closed.
    #[error("the transfer engine is closed")]
    Closed,
    /// A transfer whose operations the data plane could not end in time:
    /// bytes of it may still move, so the memory it uses stays in use
    /// (deregistering it fails) until they end.
    #[error(
        "transfer with {session}: {pending} of {total} operations could not be ended {grace:?} past its deadline (the data plane cannot end them now); bytes of it may still move, and the memory it uses stays registered until they end"
    )]
    NotEnded {
        /// The peer's session id.
        session: String,
        /// Operations not ended.
        pending: usize,
        /// Operations in the transfer.
        total: usize,
        /// The grace it was given.
        grace: Duration,
    },
    /// The guard's settings (given, or from the environment) name no
    /// guard.
    #[error("the engine's guard: {0}")]
    Guard(#[from] tensorferry_zmq::GuardError),
    /// The data plane cannot do what the engine guarantees.
    #[error("the {plane} data plane cannot serve the transfer engine: {why}")]
    Unsuitable {
        /// The data plane.
        plane: String,
        /// What it lacks, and what would serve.
        why: String,
    },
}

impl EngineError {
    /// What kind of failure it is.
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Local(e) => e.kind(),
            Self::Transport { kind, .. } => *kind,
            Self::OutsideOwn(e) => e.kind(),
            Self::NotRegistered { .. } => FaultKind::Registration,
            Self::Timeout { .. } | Self::NotEnded { .. } => FaultKind::Timeout,
            Self::BatchShape { .. } | Self::Closed | Self::Guard(_) | Self::Unsuitable { .. } => {
                FaultKind::Io
            }
        }
    }

    pub(crate) fn transport(
        verb: &'static str,
        kind: FaultKind,
        e: &impl std::fmt::Display,
    ) -> Self {
        Self::Transport {
            verb,
            message: e.to_string(),
            kind,
        }
    }
}
