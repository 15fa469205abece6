//! The engine's errors.

use std::time::Duration;

use tensorferry_core::transport::{Fault, FaultKind};
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
    /// A source outside every region this engine registered.
    #[error(
        "write of {len} bytes from {addr:#x} falls outside every region this engine registered"
    )]
    SourceOutOfBounds {
        /// The source address.
        addr: u64,
        /// The write's length.
        len: u64,
    },
    /// A read into memory outside every region this engine registered.
    #[error(
        "read of {len} bytes into {addr:#x} falls outside every region this engine registered"
    )]
    DestinationOutOfBounds {
        /// The destination address.
        addr: u64,
        /// The read's length.
        len: u64,
    },
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
}

impl EngineError {
    /// What kind of failure it is.
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Local(e) => e.kind(),
            Self::Transport { kind, .. } => *kind,
            Self::SourceOutOfBounds { .. } | Self::DestinationOutOfBounds { .. } => {
                FaultKind::OutOfBounds
            }
            Self::NotRegistered { .. } => FaultKind::Registration,
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::BatchShape { .. } | Self::Closed => FaultKind::Io,
        }
    }

    pub(crate) fn transport<E: Fault>(verb: &'static str, e: &E) -> Self {
        Self::Transport {
            verb,
            message: e.to_string(),
            kind: e.kind(),
        }
    }
}
