//! The transport's wake descriptor: an epoll set the runtime waits on
//! together with its control channel. It holds the device's completion
//! channel (readable when a completion arrives on an armed CQ) and an
//! eventfd the side channel signals when it finishes writes itself (a
//! refused or failed connection), so that neither waits for a poll.
//!
//! Named `WakeSet`, not `Wake`, so as not to be read as tensorferry-core's `Wake`
//! trait.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use tensorferry_hostmem::EventFd;

use crate::error::VerbsError;

/// The epoll set and the eventfd.
#[derive(Debug)]
pub struct WakeSet {
    epoll: OwnedFd,
    news: EventFd,
    /// Set after a signal's write, so that `clear` reads (a syscall) only
    /// when there may be something to read. A wake-up is never lost: the
    /// eventfd stays readable until a read, and a read follows only a
    /// signal that completed.
    pending: AtomicBool,
}

fn os(what: &'static str) -> VerbsError {
    VerbsError::Os {
        what,
        source: io::Error::last_os_error(),
    }
}

fn watch(epoll: &OwnedFd, fd: RawFd) -> Result<(), VerbsError> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: both descriptors are open (the epoll set is owned here, `fd`
    // by the caller for as long as the set lives); `ev` is a valid event.
    let r = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if r != 0 {
        return Err(os("add a descriptor to the wake set (epoll_ctl)"));
    }
    Ok(())
}

impl WakeSet {
    /// A wake set holding a fresh eventfd and, if given, `completions`
    /// (which must stay open while this set lives).
    pub fn new(completions: Option<RawFd>) -> Result<Self, VerbsError> {
        // SAFETY: plain descriptor creation; each result is checked and
        // owned at once.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(os("create the wake set (epoll_create1)"));
        }
        // SAFETY: `epoll` was just created and is owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        let news = EventFd::new().map_err(|source| VerbsError::Os {
            what: "create the wake eventfd",
            source,
        })?;
        watch(&epoll, news.fd())?;
        if let Some(fd) = completions {
            watch(&epoll, fd)?;
        }
        Ok(Self {
            epoll,
            news,
            pending: AtomicBool::new(false),
        })
    }

    /// The descriptor to wait on.
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Makes the set readable.
    pub fn signal(&self) {
        self.news.signal();
        self.pending.store(true, Ordering::Release);
    }

    /// Clears the eventfd (the completion channel is drained by arming the
    /// device).
    pub fn clear(&self) {
        if !self.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        self.news.clear();
    }
}

/// True if `fd` turns readable within `wait_ms`.
#[cfg(test)]
pub fn readable(fd: RawFd, wait_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, wait_ms) };
    n > 0 && p.revents & libc::POLLIN != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_is_readable_while_signalled_and_clear_after() {
        let w = WakeSet::new(None).unwrap();
        assert!(!readable(w.fd(), 0));
        w.signal();
        w.signal();
        assert!(readable(w.fd(), 0));
        w.clear();
        assert!(!readable(w.fd(), 0));
    }

    #[test]
    fn a_member_descriptor_makes_the_set_readable() {
        let other = WakeSet::new(None).unwrap();
        let w = WakeSet::new(Some(other.news.fd())).unwrap();
        assert!(!readable(w.fd(), 0));
        other.signal();
        assert!(readable(w.fd(), 0));
        other.clear();
        assert!(!readable(w.fd(), 0));
    }
}
