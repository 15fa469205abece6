//! A peer engine, attached: its process (a pidfd, which tells whether that
//! very process still runs, whatever its pid number now names) and its
//! region table.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{hint, LocalError};
use crate::session::Session;
use crate::table::{Lease, Table};

/// An attached peer.
pub(crate) struct Peer {
    /// Its session id, as given.
    pub text: String,
    /// Its process id.
    pub pid: i32,
    pidfd: OwnedFd,
    /// Its region table.
    pub table: Table,
    /// This process's place in that table, to count its copies in (so
    /// that the peer can tell, should this process die mid-copy, that
    /// nothing of it still runs); `None`: every place was taken.
    pub lease: Option<Lease>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        // No copy of this process's is inside: each holds the peer.
        if let Some(lease) = self.lease.take() {
            self.table.release(lease);
        }
    }
}

impl Peer {
    /// Attaches to the engine `session` names (parsed from `text`).
    pub(crate) fn attach(text: &str, session: &Session) -> Result<Self, LocalError> {
        let peer_sys = |call, source: io::Error| LocalError::PeerSys {
            call,
            session: text.to_owned(),
            pid: session.pid,
            hint: hint(source.raw_os_error()),
            source,
        };
        // SAFETY: pidfd_open takes a pid and flags, and returns a new
        // descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, session.pid, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Err(LocalError::PeerGone {
                    session: text.to_owned(),
                    why: format!("no process {} runs", session.pid),
                });
            }
            return Err(peer_sys("pidfd_open", e));
        }
        // SAFETY: a descriptor just returned to us and owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        // SAFETY: pidfd_getfd copies the peer's descriptor into this
        // process, returning a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), session.fd, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBADF) {
                return Err(LocalError::PeerGone {
                    session: text.to_owned(),
                    why: format!(
                        "process {} has no descriptor {}: its engine is closed",
                        session.pid, session.fd
                    ),
                });
            }
            return Err(peer_sys("pidfd_getfd", e));
        }
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let table = Table::attach(&fd, session.nonce).map_err(|why| LocalError::PeerGone {
            session: text.to_owned(),
            why,
        })?;
        let lease = table.lease();
        Ok(Self {
            text: text.to_owned(),
            pid: session.pid,
            pidfd,
            table,
            lease,
        })
    }

    /// True while the peer's process runs (its pid cannot have been reused
    /// for another).
    pub(crate) fn alive(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }
}
