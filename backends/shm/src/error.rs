//! The backend's errors: each names the call, the object or peer, and the
//! errno where there is one.

use std::io;

use tensorferry_core::transport::{FaultKind, RegionError};

/// A shared-memory pool or transport error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A region of this transport's: unknown, a source outside it, or one
    /// too many.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// A system call on a shared-memory object failed.
    #[error("{call} on shared-memory object {name}: {source}")]
    Sys {
        /// The call (`shm_open`, `ftruncate`, `mmap`, ...).
        call: &'static str,
        /// The object.
        name: String,
        /// The OS error.
        source: io::Error,
    },
    /// A peer's object no longer exists: its owner dropped it or died and
    /// it was cleaned up.
    #[error("peer session {session}: its shared-memory object is gone")]
    PeerGone {
        /// The peer's session id.
        session: String,
    },
    /// A session id that is not `shm:<name>@<base hex>+<len>`.
    #[error("session id {session:?} is not a shared-memory session: {why}")]
    BadSession {
        /// The session id.
        session: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A peer's object is smaller than its session id claims.
    #[error("peer session {session}: object holds {actual} bytes, session says {claimed}")]
    ShortObject {
        /// The peer's session id.
        session: String,
        /// Bytes the session id claims.
        claimed: u64,
        /// Bytes the object holds.
        actual: u64,
    },
    /// A write's destination is outside the peer's pool.
    #[error("write of {len} bytes to {addr:#x} falls outside peer {session}'s pool ({base:#x}, {pool_len} bytes)")]
    DestOutOfBounds {
        /// The peer's session id.
        session: String,
        /// The destination address.
        addr: u64,
        /// The write's length.
        len: u64,
        /// The pool's base address in the peer.
        base: u64,
        /// The pool's length.
        pool_len: u64,
    },
    /// The peer made its pool smaller than its session says, after this
    /// side mapped it (found before the copy, or by the fault it caused):
    /// the write fails rather than the process.
    #[error(
        "peer session {session}: its pool shrank to {actual} bytes (its session says {claimed})"
    )]
    PeerShrank {
        /// The peer's session.
        session: String,
        /// The size the session claims.
        claimed: u64,
        /// The object's size now.
        actual: u64,
    },
    /// Memory to register that is not inside this transport's pool: only
    /// the pool is shared with peers.
    #[error("cannot register {len} bytes at {addr:#x}: not inside the shared pool")]
    NotShared {
        /// The start.
        addr: u64,
        /// The length.
        len: u64,
    },
    /// A one-sided read: this data plane only writes (ferry's nodes never
    /// read; the transfer engine's backends do).
    #[error("read of {len} bytes from {session}: the shm data plane does not read")]
    ReadUnsupported {
        /// The peer that was to be read.
        session: String,
        /// The read's length.
        len: u64,
    },
}

impl ShmError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Sys { .. } => FaultKind::Io,
            Self::PeerGone { .. } => FaultKind::PeerGone,
            Self::BadSession { .. } | Self::ShortObject { .. } => FaultKind::UnknownPeer,
            Self::DestOutOfBounds { .. } | Self::PeerShrank { .. } => FaultKind::OutOfBounds,
            Self::Region(e) => e.kind(),
            Self::NotShared { .. } => FaultKind::Registration,
            Self::ReadUnsupported { .. } => FaultKind::Io,
        }
    }
}

/// A Unix-socket control channel error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdsError {
    /// A socket call failed.
    #[error("{call} on {endpoint}: {source}")]
    Sys {
        /// The call (`bind`, `connect`, `sendmsg`, ...).
        call: &'static str,
        /// The endpoint concerned.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
    /// The peer is not there (no socket, connection refused or reset).
    #[error("peer {endpoint} is gone ({call}: {source})")]
    PeerGone {
        /// The call that found out.
        call: &'static str,
        /// The peer's endpoint.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
    /// The peer did not take the message in time.
    #[error("peer {endpoint} did not take a message within {millis} ms")]
    Timeout {
        /// The peer's endpoint.
        endpoint: String,
        /// The send timeout.
        millis: u64,
    },
    /// An endpoint that is not `ipc://<path>` (or a path).
    #[error("endpoint {endpoint:?}: {why}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A message larger than the receive buffer (dropped).
    #[error("message of {len} bytes from {from} exceeds the {cap}-byte buffer; dropped")]
    TooLarge {
        /// The sender.
        from: String,
        /// Its length.
        len: usize,
        /// The buffer's size.
        cap: usize,
    },
    /// A packet that is not a well-formed frame (dropped).
    #[error("malformed packet from {from}: {why}; dropped")]
    Malformed {
        /// The sender.
        from: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A message of other than two frames, which this channel's wire does
    /// not carry (nothing sent).
    #[error("a message to {to} of {count} frames; this channel carries two")]
    Frames {
        /// The destination.
        to: String,
        /// The frames given.
        count: usize,
    },
}

impl UdsError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Sys { .. } | Self::Malformed { .. } | Self::Frames { .. } => FaultKind::Io,
            Self::PeerGone { .. } => FaultKind::PeerGone,
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::BadEndpoint { .. } => FaultKind::UnknownPeer,
            Self::TooLarge { .. } => FaultKind::TooLarge,
        }
    }
}

/// An in-process control channel error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemError {
    /// No channel is bound at the endpoint (any more).
    #[error("no in-process channel at {endpoint}")]
    PeerGone {
        /// The endpoint.
        endpoint: String,
    },
    /// A message larger than the receive buffer (dropped).
    #[error("message of {len} bytes from {from} exceeds the {cap}-byte buffer; dropped")]
    TooLarge {
        /// The sender.
        from: String,
        /// Its length.
        len: usize,
        /// The buffer's size.
        cap: usize,
    },
    /// An endpoint already bound.
    #[error("endpoint {endpoint} is already bound")]
    InUse {
        /// The endpoint.
        endpoint: String,
    },
    /// A message of other than two frames, which this channel's wire does
    /// not carry (nothing sent).
    #[error("a message to {to} of {count} frames; this channel carries two")]
    Frames {
        /// The destination.
        to: String,
        /// The frames given.
        count: usize,
    },
}

impl MemError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::PeerGone { .. } => FaultKind::PeerGone,
            Self::TooLarge { .. } => FaultKind::TooLarge,
            Self::InUse { .. } | Self::Frames { .. } => FaultKind::Io,
        }
    }
}
