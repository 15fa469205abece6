//! What kind of failure an error is ([`FaultKind`]), whatever backend
//! raised it, with the one table of the kinds' names and codes. Each of
//! the three seams' traits says which kind its errors are (`fault_kind`).

use core::fmt;

use super::errno;

/// What kind of failure an error is, whatever backend raised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// The peer is gone: its process exited, its endpoint or memory object
    /// vanished, its connection was refused.
    PeerGone,
    /// The peer's session id or endpoint names nothing this backend can
    /// reach, or cannot be parsed.
    UnknownPeer,
    /// A write's source or destination lies outside registered memory.
    OutOfBounds,
    /// A message or write is larger than the backend can carry.
    TooLarge,
    /// The peer did not take the message or write in time (its queue is
    /// full, or the write was ended unfinished when its time ran out).
    Timeout,
    /// A registration failed (bad range, resources exhausted).
    Registration,
    /// Any other operating-system or library error.
    Io,
}

impl FaultKind {
    /// A short reason, as sent in `transfer_pushed.error` or
    /// `transfer_done.error`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PeerGone => "peer gone",
            Self::UnknownPeer => "unknown peer",
            Self::OutOfBounds => "write outside registered memory",
            Self::TooLarge => "too large",
            Self::Timeout => "timed out",
            Self::Registration => "memory registration failed",
            Self::Io => "i/o error",
        }
    }

    /// What kind of failure an errno (Linux's numbering, positive; also
    /// libfabric's `FI_E*` values, which equal them) is, for an error that
    /// concerns one peer or one write. The RDMA data planes classify by
    /// this one table.
    pub const fn of_errno(errno: i32) -> Self {
        match errno {
            errno::ECONNREFUSED
            | errno::ECONNRESET
            | errno::ECONNABORTED
            | errno::EHOSTUNREACH
            | errno::ENETUNREACH
            | errno::EHOSTDOWN
            | errno::ENETDOWN
            | errno::ENOTCONN
            | errno::ESHUTDOWN
            | errno::EADDRNOTAVAIL
            | errno::EPIPE => Self::PeerGone,
            errno::ETIMEDOUT => Self::Timeout,
            errno::EMSGSIZE | errno::E2BIG | errno::EOVERFLOW => Self::TooLarge,
            errno::EACCES | errno::EKEYREJECTED | errno::EFAULT => Self::OutOfBounds,
            _ => Self::Io,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one table of fault kinds: their names (as telemetry labels them and
/// Python's `FerryError.kind` carries them) and their codes (as sglang's
/// `transfer_sync` returns them). Every other layer reads them from here.
impl FaultKind {
    /// Every kind, by code from -2 down, and `Io` (-1, the catch-all)
    /// last.
    pub const ALL: [FaultKind; 7] = [
        Self::UnknownPeer,
        Self::OutOfBounds,
        Self::PeerGone,
        Self::Timeout,
        Self::TooLarge,
        Self::Registration,
        Self::Io,
    ];

    /// Its name in snake case (`peer_gone`, `timeout`, ...): a metric's
    /// label value, Python's `FerryError.kind`.
    pub const fn as_name(self) -> &'static str {
        match self {
            Self::PeerGone => "peer_gone",
            Self::UnknownPeer => "unknown_peer",
            Self::OutOfBounds => "out_of_bounds",
            Self::TooLarge => "too_large",
            Self::Timeout => "timeout",
            Self::Registration => "registration",
            Self::Io => "io",
        }
    }

    /// What a failed transfer of this kind returns through sglang's
    /// engine contract (`transfer_sync`): always negative, 0 being success.
    pub const fn code(self) -> i32 {
        match self {
            Self::Io => -1,
            Self::UnknownPeer => -2,
            Self::OutOfBounds => -3,
            Self::PeerGone => -4,
            Self::Timeout => -5,
            Self::TooLarge => -6,
            Self::Registration => -7,
        }
    }

    /// The kind named `name` ([`FaultKind::as_name`]), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_name() == name)
    }
}
