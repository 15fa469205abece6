//! A safe API over libzmq, as `tensorferry-zmq-sys` builds it (with
//! CURVE): the part of the published `zmq` crate's API ferry uses, under
//! the same names, so that code written against that crate needs only its
//! imports changed.
//!
//! ferry owns this binding because the published `zmq` crate's sys crate
//! builds libzmq without CURVE, and a `[patch]` of it does not reach the
//! crates that depend on ferry (see `docs/design.md`).
//!
//! - [`Context`] (cheap to clone, shared between threads) makes
//!   [`Socket`]s of a [`SocketType`] ([`PUSH`], [`PULL`], ...); each
//!   socket keeps its context alive, and the context is terminated when
//!   the last of both is dropped.
//! - A socket binds, connects, sends ([`DONTWAIT`], [`SNDMORE`]) and
//!   receives bytes or a [`Message`] (with the connection's metadata),
//!   takes the options ferry sets (`set_linger`, `set_curve_server`, ...)
//!   and reports its connections' [`SocketEvent`]s to a monitor
//!   ([`MonitorEvent`]).
//! - [`poll`] waits on sockets and file descriptors ([`PollItem`]).
//! - [`CurveKeyPair`] makes CURVE keys; [`has`] asks what this libzmq can
//!   do. Failures are [`Error`]s, libzmq's error numbers.
//!
//! ```
//! use tensorferry_zmq::zmq;
//!
//! let ctx = zmq::Context::new();
//! let pull = ctx.socket(zmq::PULL)?;
//! pull.bind("inproc://doc")?;
//! let push = ctx.socket(zmq::PUSH)?;
//! push.connect("inproc://doc")?;
//! push.send_multipart([&b"a"[..], b"b"], 0)?;
//! assert_eq!(pull.recv_multipart(0)?, [b"a".to_vec(), b"b".to_vec()]);
//! assert_eq!(zmq::has("curve"), Some(true));
//! # Ok::<(), zmq::Error>(())
//! ```

use std::ffi::{c_char, CString};

use tensorferry_zmq_sys as sys;

mod error;
mod message;
mod monitor;
mod poll;
mod socket;

#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use message::Message;
pub use monitor::{MonitorEvent, SocketEvent};
pub use poll::{poll, PollEvents, PollItem, POLLERR, POLLIN, POLLOUT};
pub use socket::{Context, Socket, SocketType};
pub use SocketType::{DEALER, PAIR, PUB, PULL, PUSH, REP, REQ, ROUTER, STREAM, SUB, XPUB, XSUB};

/// Send and receive flag: do not wait; fail with [`Error::EAGAIN`]
/// instead.
pub const DONTWAIT: i32 = sys::ZMQ_DONTWAIT;
/// Send flag: more frames of this message follow.
pub const SNDMORE: i32 = sys::ZMQ_SNDMORE;

/// libzmq's version: (major, minor, patch).
pub fn version() -> (i32, i32, i32) {
    let (mut major, mut minor, mut patch) = (0, 0, 0);
    // SAFETY: the three pointers are to live integers the call writes.
    unsafe { sys::zmq_version(&mut major, &mut minor, &mut patch) };
    (major, minor, patch)
}

/// Whether this libzmq has `capability` (`"curve"`, `"ipc"`, `"ws"`,
/// ...); `None` only for a name with a NUL in it, which names nothing.
pub fn has(capability: &str) -> Option<bool> {
    let name = CString::new(capability).ok()?;
    // SAFETY: `name` is NUL-terminated and outlives the call, which only
    // reads it.
    Some(unsafe { sys::zmq_has(name.as_ptr()) } == 1)
}

/// A new CURVE key pair, as 32-byte keys.
#[derive(Clone, PartialEq, Eq)]
pub struct CurveKeyPair {
    /// The public key.
    pub public_key: [u8; 32],
    /// The secret key.
    pub secret_key: [u8; 32],
}

impl std::fmt::Debug for CurveKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret half: a key pair may be logged.
        f.debug_struct("CurveKeyPair")
            .field("public_key", &self.public_key)
            .finish_non_exhaustive()
    }
}

impl CurveKeyPair {
    /// A new key pair from libzmq (libsodium's random source);
    /// [`Error::ENOTSUP`] from a libzmq without CURVE.
    pub fn new() -> Result<Self> {
        let mut public = [0 as c_char; 41];
        let mut secret = [0 as c_char; 41];
        // SAFETY: each buffer is the 41 bytes the call writes (40
        // characters of Z85 and a NUL).
        if unsafe { sys::zmq_curve_keypair(public.as_mut_ptr(), secret.as_mut_ptr()) } == -1 {
            return Err(Error::last());
        }
        Ok(Self {
            public_key: z85_key(&public)?,
            secret_key: z85_key(&secret)?,
        })
    }
}

/// The 32-byte key of 40 characters of Z85 (and a NUL), as
/// zmq_curve_keypair writes them.
fn z85_key(text: &[c_char; 41]) -> Result<[u8; 32]> {
    if text[40] != 0 {
        return Err(Error::EPROTO);
    }
    let mut key = [0u8; 32];
    // SAFETY: `text` is NUL-terminated (checked), so the call reads at
    // most its 41 bytes, and decodes at most 40 characters into at most
    // 40 * 4 / 5 = 32 bytes: `key`'s size.
    let done = unsafe { sys::zmq_z85_decode(key.as_mut_ptr(), text.as_ptr()) };
    if done.is_null() {
        return Err(Error::EPROTO);
    }
    Ok(key)
}
