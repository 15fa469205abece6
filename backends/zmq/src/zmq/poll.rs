//! [`poll`]: waiting on sockets and file descriptors together.

use std::ffi::{c_int, c_long};
use std::marker::PhantomData;
use std::ops::{BitAnd, BitOr, BitOrAssign};
use std::os::fd::RawFd;

use tensorferry_zmq_sys as sys;

use super::error::{Error, Result};
use super::socket::Socket;

/// The events a [`PollItem`] waits for, or that occurred: a set of
/// [`POLLIN`], [`POLLOUT`], [`POLLERR`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PollEvents(i16);

impl PollEvents {
    /// A message can be received (a file descriptor read).
    pub const POLLIN: Self = Self(sys::ZMQ_POLLIN);
    /// A message can be sent (a file descriptor written).
    pub const POLLOUT: Self = Self(sys::ZMQ_POLLOUT);
    /// An error condition on a file descriptor.
    pub const POLLERR: Self = Self(sys::ZMQ_POLLERR);

    /// No events.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// The set as libzmq's bits.
    pub const fn bits(self) -> i16 {
        self.0
    }

    /// The set of these bits, without those that name no event here.
    pub const fn from_bits_truncate(bits: i16) -> Self {
        Self(bits & (sys::ZMQ_POLLIN | sys::ZMQ_POLLOUT | sys::ZMQ_POLLERR))
    }

    /// True if every event of `other` is in this set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if the set has no event.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl BitOr for PollEvents {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl BitOrAssign for PollEvents {
    fn bitor_assign(&mut self, other: Self) {
        self.0 |= other.0;
    }
}

impl BitAnd for PollEvents {
    type Output = Self;
    fn bitand(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

/// A message can be received (a file descriptor read).
pub const POLLIN: PollEvents = PollEvents::POLLIN;
/// A message can be sent (a file descriptor written).
pub const POLLOUT: PollEvents = PollEvents::POLLOUT;
/// An error condition on a file descriptor.
pub const POLLERR: PollEvents = PollEvents::POLLERR;

/// One thing [`poll`] waits on: a socket (borrowed for `'a`, so that it
/// stays open and unused elsewhere while polled) or a file descriptor.
#[repr(transparent)]
pub struct PollItem<'a> {
    raw: sys::zmq_pollitem_t,
    _socket: PhantomData<&'a Socket>,
}

impl std::fmt::Debug for PollItem<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollItem")
            .field("socket", &self.raw.socket)
            .field("fd", &self.raw.fd)
            .field("events", &self.raw.events)
            .field("revents", &self.raw.revents)
            .finish()
    }
}

impl<'a> PollItem<'a> {
    pub(super) fn from_socket(socket: &'a Socket, events: PollEvents) -> Self {
        Self {
            raw: sys::zmq_pollitem_t {
                socket: socket.as_ptr(),
                fd: 0,
                events: events.bits(),
                revents: 0,
            },
            _socket: PhantomData,
        }
    }

    /// An item that waits for `events` of the file descriptor `fd` (a
    /// descriptor closed meanwhile makes [`poll`] fail or report it, as
    /// poll(2) does; nothing worse).
    pub fn from_fd(fd: RawFd, events: PollEvents) -> Self {
        Self {
            raw: sys::zmq_pollitem_t {
                socket: std::ptr::null_mut(),
                fd,
                events: events.bits(),
                revents: 0,
            },
            _socket: PhantomData,
        }
    }

    /// Changes the events it waits for.
    pub fn set_events(&mut self, events: PollEvents) {
        self.raw.events = events.bits();
    }

    /// The events that occurred in the last [`poll`].
    pub fn get_revents(&self) -> PollEvents {
        PollEvents::from_bits_truncate(self.raw.revents)
    }

    /// A message can be received (the descriptor read).
    pub fn is_readable(&self) -> bool {
        self.get_revents().contains(POLLIN)
    }

    /// A message can be sent (the descriptor written).
    pub fn is_writable(&self) -> bool {
        self.get_revents().contains(POLLOUT)
    }

    /// An error condition on the descriptor.
    pub fn is_error(&self) -> bool {
        self.get_revents().contains(POLLERR)
    }
}

/// Waits up to `timeout_ms` (-1: forever, 0: not at all) until an event of
/// `items` occurs; the number of items with events (0: the time ran out).
/// EINTR if a signal came first.
pub fn poll(items: &mut [PollItem<'_>], timeout_ms: i64) -> Result<i32> {
    let n = c_int::try_from(items.len()).map_err(|_| Error::EINVAL)?;
    // c_long is 32 bits on some targets: a longer wait than it holds is
    // as good as forever there.
    let timeout = c_long::try_from(timeout_ms).unwrap_or(-1);
    // SAFETY: PollItem is a transparent zmq_pollitem_t, so the slice is
    // `n` of them; each socket in it is borrowed (`'a`), hence open and not
    // used by another thread (Socket is not Sync) during the call, which
    // writes only the items' `revents`.
    let rc = unsafe { sys::zmq_poll(items.as_mut_ptr().cast(), n, timeout) };
    if rc == -1 {
        Err(Error::last())
    } else {
        Ok(rc)
    }
}
