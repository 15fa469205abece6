//! The eventfd every data plane wakes the runtime with.
//!
//! A transport whose completions arrive on a thread of its own (libfabric's
//! progress thread, the verbs side channel) signals one of these, and the
//! runtime sleeps on its descriptor together with the control channel
//! (`Transport::wake_fd`). One wrapper, so that the flags, the 8-byte
//! protocol and the error handling are written once.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking, close-on-exec eventfd used as a level-triggered flag:
/// readable from the first [`signal`](Self::signal) until the next
/// [`clear`](Self::clear).
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd, clear.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (a no-op if it is already).
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our own eventfd; a
        // full counter (EAGAIN) already means readable, so the result is
        // not needed.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Makes the descriptor unreadable until the next signal; returns true
    /// if it was signalled.
    pub fn clear(&self) -> bool {
        let mut v = [0u8; 8];
        // SAFETY: reads 8 bytes into a live buffer from our own
        // non-blocking eventfd; EAGAIN means it was clear.
        let n = unsafe { libc::read(self.0.as_raw_fd(), v.as_mut_ptr().cast(), v.len()) };
        n == 8
    }

    /// The descriptor to wait on (`poll`, `epoll`), owned by `self`.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn readable_from_a_signal_until_cleared() {
        let e = EventFd::new().unwrap();
        assert!(!readable(e.fd()));
        assert!(!e.clear(), "a fresh eventfd is clear");
        e.signal();
        e.signal();
        assert!(readable(e.fd()));
        assert!(e.clear());
        assert!(!readable(e.fd()), "one clear takes every signal");
        assert!(!e.clear());
    }
}
