//! The local data plane's errors: each names the call, the peer (its
//! session id) or the address, and the errno where there is one.

use std::io;
use std::time::Duration;

use tensorferry_core::transport::{FaultKind, OutsideOwnRegions, OutsidePeerRegions};

use crate::copy::Direction;

/// A local engine error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// A system call on this engine's own resources failed.
    #[error("{call}: {source}")]
    Sys {
        /// The call (`memfd_create`, `mmap`, `fcntl`, ...).
        call: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A session id that is not a local engine's.
    #[error("session id {session:?} is not a local session: {why}")]
    BadSession {
        /// The session id.
        session: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A session of an engine on another host, or in another pid
    /// namespace, where its process id names nothing of ours.
    #[error("session {session} belongs to another host or pid namespace ({theirs}; this process is on {ours})")]
    OtherHost {
        /// The session id.
        session: String,
        /// The host it names.
        theirs: String,
        /// This host.
        ours: String,
    },
    /// The peer cannot be reached: its process exited, closed its engine,
    /// or its table is not what its session id says.
    #[error("peer session {session}: {why}")]
    PeerGone {
        /// The peer's session id.
        session: String,
        /// What was found.
        why: String,
    },
    /// A system call on a peer failed.
    #[error("{call} on peer session {session} (pid {pid}): {source}{hint}")]
    PeerSys {
        /// The call (`pidfd_open`, `pidfd_getfd`, `process_vm_writev`,
        /// `process_vm_readv`).
        call: &'static str,
        /// The peer's session id.
        session: String,
        /// Its process id.
        pid: i32,
        /// The OS error.
        source: io::Error,
        /// What to do about it, when the errno says (empty otherwise).
        hint: &'static str,
    },
    /// A write's destination or a read's source outside every region the
    /// peer registered.
    #[error(transparent)]
    OutsidePeer(#[from] OutsidePeerRegions),
    /// A write's source or a read's destination outside every region
    /// this engine registered.
    #[error(transparent)]
    OutsideOwn(#[from] OutsideOwnRegions),
    /// The kernel copied part of a write or read only: the peer unmapped
    /// part of a region it registered.
    #[error("peer session {session}: {direction} of {len} bytes copied only {written} ({why})")]
    Partial {
        /// The peer's session id.
        session: String,
        /// Which way the bytes went.
        direction: Direction,
        /// Bytes that reached their destination.
        written: u64,
        /// Bytes asked for.
        len: u64,
        /// What the kernel said of the rest.
        why: String,
    },
    /// A write or read posted and ended unmade: its caller gave up waiting
    /// (`Transport::cancel_transfers`).
    #[error(
        "{direction} with peer session {session} ended before it was made: its caller stopped waiting"
    )]
    Cancelled {
        /// The peer's session id.
        session: String,
        /// Which way its bytes were to go.
        direction: Direction,
    },
    /// A registration that cannot be made.
    #[error("register {len} bytes at {addr:#x}: {why}")]
    Register {
        /// The region's first byte.
        addr: u64,
        /// Its length.
        len: u64,
        /// Why.
        why: &'static str,
    },
    /// `deregister` of an address no region starts at.
    #[error("deregister {addr:#x}: no registered region starts there")]
    NotRegistered {
        /// The address.
        addr: u64,
    },
    /// `deregister` gave up waiting for peers still copying into or out of
    /// this engine's memory: the region is out of the table, but its
    /// memory is still the engine's (keep it mapped, and deregister it
    /// again).
    #[error(
        "deregister {len} bytes at {addr:#x}: peers' copies were still running after {waited:?} (processes {pids:?}, {unnamed} unnamed); the region stays the engine's: keep its memory mapped and deregister it again"
    )]
    PeerInside {
        /// The region's first byte.
        addr: u64,
        /// Its length.
        len: u64,
        /// How long it waited.
        waited: Duration,
        /// The processes still inside.
        pids: Vec<u32>,
        /// Copies of writers without a place of their own.
        unnamed: u64,
    },
    /// The peer's table kept changing while it was read.
    #[error("peer session {session}: its region table did not hold still to be read")]
    TableBusy {
        /// The peer's session id.
        session: String,
    },
}

impl LocalError {
    /// What kind of failure this is (what its data plane's or channel's
    /// `fault_kind` says of it).
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Sys { .. } => FaultKind::Io,
            Self::BadSession { .. } | Self::OtherHost { .. } => FaultKind::UnknownPeer,
            Self::PeerGone { .. } | Self::TableBusy { .. } => FaultKind::PeerGone,
            Self::PeerSys { source, .. } => match source.raw_os_error() {
                Some(libc::ESRCH) => FaultKind::PeerGone,
                Some(libc::EFAULT) => FaultKind::OutOfBounds,
                _ => FaultKind::Io,
            },
            Self::OutsidePeer(_) | Self::OutsideOwn(_) | Self::Partial { .. } => {
                FaultKind::OutOfBounds
            }
            Self::Register { .. } | Self::NotRegistered { .. } => FaultKind::Registration,
            Self::Cancelled { .. } | Self::PeerInside { .. } => FaultKind::Timeout,
        }
    }
}

/// What to do about an errno a call on a peer returned.
pub(crate) fn hint(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (the kernel refuses this process access to the peer's memory: both must run as the same user, and Yama's kernel.yama.ptrace_scope must be 0)"
        }
        Some(libc::ENOSYS) => " (this kernel lacks the call: Linux 5.6 or later is needed)",
        _ => "",
    }
}
