//! The channel's error, and the mapping of ZeroMQ's errors onto it.

use tensorferry_core::transport::FaultKind;

use crate::zmq;

/// A ZeroMQ control-channel error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZmqError {
    /// A ZeroMQ call failed.
    #[error("{call} on {endpoint}: {source}")]
    Sys {
        /// The call (`bind`, `connect`, `send`, ...).
        call: &'static str,
        /// The endpoint concerned.
        endpoint: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// The peer's queue stayed full for the send timeout (the message was
    /// not sent).
    #[error(
        "peer {endpoint} did not take a message within {millis} ms (queue full or not connected)"
    )]
    Timeout {
        /// The peer's endpoint.
        endpoint: String,
        /// The send timeout.
        millis: u64,
    },
    /// A message larger than the receive buffer (dropped).
    #[error("message of {len} bytes at {via} exceeds the {cap}-byte buffer; dropped")]
    TooLarge {
        /// Where it arrived.
        via: String,
        /// Its length.
        len: usize,
        /// The buffer's size.
        cap: usize,
    },
    /// A message that is not two frames where a transfer message must be
    /// (dropped).
    #[error("malformed message at {via}: {why}; dropped")]
    Malformed {
        /// Where it arrived.
        via: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No CURVE server key is known for a destination: CURVE is on, and
    /// the endpoint neither registered over an authenticated connection
    /// nor is the one admitted key's (the message was not sent).
    #[error(
        "no CURVE server key for {endpoint}: it did not register over an authenticated connection"
    )]
    NoServerKey {
        /// The destination.
        endpoint: String,
    },
    /// A peer that requires CURVE, and this process has no key.
    #[error("{endpoint} requires CURVE, and this process has no key (--curve-key)")]
    NoKey {
        /// The peer's endpoint.
        endpoint: String,
    },
    /// CURVE keys were given, and the libzmq this program is linked with
    /// has no CURVE (`zmq_has("curve")` is false), so no socket could use
    /// them.
    #[error(
        "CURVE keys were given, and this program's libzmq was built without CURVE \
         (zmq_has(\"curve\") is false): build it with tensorferry-zmq-sys's libzmq, which \
         has CURVE (a [patch] or build that swaps in another libzmq must link libsodium), \
         or run without CURVE keys"
    )]
    NoCurve,
}

impl ZmqError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Sys { .. } | Self::Malformed { .. } | Self::NoKey { .. } | Self::NoCurve => {
                FaultKind::Io
            }
            Self::NoServerKey { .. } => FaultKind::UnknownPeer,
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::TooLarge { .. } => FaultKind::TooLarge,
        }
    }
}

/// Maps a ZeroMQ error of `call` on `endpoint` to a [`ZmqError`].
pub(crate) fn sys<'e>(
    call: &'static str,
    endpoint: &'e str,
) -> impl FnOnce(zmq::Error) -> ZmqError + 'e {
    move |source| ZmqError::Sys {
        call,
        endpoint: endpoint.to_owned(),
        source,
    }
}
