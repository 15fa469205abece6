//! [`Message`]: one frame as libzmq holds it, with its metadata.

use std::ffi::{CStr, CString};
use std::fmt;
use std::ops::Deref;

use tensorferry_zmq_sys as sys;

/// One frame, received into libzmq's own storage (no copy), with the
/// metadata of the connection it came over ([`gets`](Self::gets)).
/// Reads as its bytes (`Deref<Target = [u8]>`).
pub struct Message {
    raw: sys::zmq_msg_t,
}

// `Message` is Send and Sync by its fields (a byte array), which is right:
// libzmq counts references to a message's shared content and metadata
// atomically, so one may be released on any thread, and `&Message` only
// reads.

impl Message {
    /// An empty message (to receive into).
    pub fn new() -> Self {
        let mut raw = sys::zmq_msg_t::zeroed();
        // SAFETY: `raw` is storage for a message; zmq_msg_init makes it an
        // empty one and cannot fail. A zmq_msg_t holds no pointer into
        // itself (libzmq finds a small message's bytes from the struct's
        // address at each call), so moving it afterwards, as returning
        // does, is sound: libzmq's own queues move messages by copying.
        unsafe { sys::zmq_msg_init(&mut raw) };
        Self { raw }
    }

    pub(super) fn as_raw_mut(&mut self) -> *mut sys::zmq_msg_t {
        &mut self.raw
    }

    fn as_raw(&self) -> *const sys::zmq_msg_t {
        &self.raw
    }

    /// More frames of its message follow.
    pub fn get_more(&self) -> bool {
        // SAFETY: `raw` is an initialised message; the call only reads it.
        unsafe { sys::zmq_msg_more(self.as_raw()) != 0 }
    }

    /// A metadata property of a received message: `"User-Id"` (what the
    /// ZAP handler named the connection, its CURVE key in Z85 for ferry),
    /// `"Peer-Address"` (the peer's IP), `"Socket-Type"`, ... `None` if it
    /// has none, or it is not UTF-8.
    pub fn gets(&self, property: &str) -> Option<&str> {
        let name = CString::new(property).ok()?;
        // SAFETY: `raw` is an initialised message and `name` is
        // NUL-terminated; the call only reads them.
        let value = unsafe { sys::zmq_msg_gets(self.as_raw(), name.as_ptr()) };
        if value.is_null() {
            return None;
        }
        // SAFETY: non-null: a NUL-terminated string in the metadata the
        // message holds a reference to, which lives until the message is
        // closed or received into again, both of which need `&mut self` or
        // `self`, so not while the returned borrow of `self` lives.
        unsafe { CStr::from_ptr(value) }.to_str().ok()
    }
}

impl Default for Message {
    fn default() -> Self {
        Self::new()
    }
}

impl Deref for Message {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `raw` is an initialised message; zmq_msg_size only reads
        // it.
        let len = unsafe { sys::zmq_msg_size(self.as_raw()) };
        if len == 0 {
            return &[];
        }
        // SAFETY: zmq_msg_data only computes the address of the content
        // (it takes a mutable pointer but writes nothing), which is `len`
        // readable bytes, alive and unchanged until the message is closed
        // or received into again: both need `&mut self` or `self`, so not
        // while this borrow of `self` lives.
        unsafe {
            let data = sys::zmq_msg_data(self.as_raw().cast_mut());
            std::slice::from_raw_parts(data.cast::<u8>(), len)
        }
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("len", &self.len())
            .field("more", &self.get_more())
            .finish()
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        // SAFETY: `raw` is an initialised message, released once, here.
        unsafe { sys::zmq_msg_close(&mut self.raw) };
    }
}
