//! [`Context`] and [`Socket`]: libzmq's context and sockets, with the
//! options ferry sets.

use std::ffi::{c_int, c_void, CString};
use std::os::fd::RawFd;
use std::sync::Arc;

use tensorferry_zmq_sys as sys;

use super::error::{Error, Result};
use super::message::Message;
use super::poll::{poll, PollEvents, PollItem};

/// A socket's type (`zmq_socket(3)`); also each type's name alone
/// (`zmq::PUSH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)] // the C names, as every manual page spells them
pub enum SocketType {
    /// Exclusive pair.
    PAIR,
    /// Publisher.
    PUB,
    /// Subscriber.
    SUB,
    /// Request (strict send, receive alternation).
    REQ,
    /// Reply (strict receive, send alternation).
    REP,
    /// Asynchronous request, load-balanced.
    DEALER,
    /// Asynchronous reply, routed by peer identity.
    ROUTER,
    /// Pipeline receiver.
    PULL,
    /// Pipeline sender.
    PUSH,
    /// Publisher that sees subscriptions.
    XPUB,
    /// Subscriber that sends subscriptions as messages.
    XSUB,
    /// Raw TCP.
    STREAM,
}

impl SocketType {
    fn to_raw(self) -> c_int {
        match self {
            Self::PAIR => sys::ZMQ_PAIR,
            Self::PUB => sys::ZMQ_PUB,
            Self::SUB => sys::ZMQ_SUB,
            Self::REQ => sys::ZMQ_REQ,
            Self::REP => sys::ZMQ_REP,
            Self::DEALER => sys::ZMQ_DEALER,
            Self::ROUTER => sys::ZMQ_ROUTER,
            Self::PULL => sys::ZMQ_PULL,
            Self::PUSH => sys::ZMQ_PUSH,
            Self::XPUB => sys::ZMQ_XPUB,
            Self::XSUB => sys::ZMQ_XSUB,
            Self::STREAM => sys::ZMQ_STREAM,
        }
    }
}

/// A libzmq context, terminated when the last [`Context`] clone and the
/// last socket made in it are dropped.
struct RawContext(*mut c_void);

// SAFETY: libzmq's contexts are thread-safe (`zmq_ctx_new(3)`): any thread
// may make sockets in one, and terminating it is left to whichever thread
// drops the last reference.
unsafe impl Send for RawContext {}
// SAFETY: as above; the pointer itself is never changed.
unsafe impl Sync for RawContext {}

impl Drop for RawContext {
    fn drop(&mut self) {
        loop {
            // SAFETY: the pointer came from zmq_ctx_new and is terminated
            // once, here. Every socket holds this context (an Arc), so all
            // are closed by now and zmq_ctx_term only waits for their
            // lingering messages, never for a socket someone still uses.
            let rc = unsafe { sys::zmq_ctx_term(self.0) };
            if rc == 0 || Error::last() != Error::EINTR {
                break;
            }
        }
    }
}

/// A ZeroMQ context: the I/O threads, and the `inproc://` namespace of its
/// sockets. Clones share one context; it is terminated once the last
/// clone and the last socket made in it are dropped (each socket keeps its
/// context alive, so a socket can never outlive it).
#[derive(Clone)]
pub struct Context {
    /// The context, or why libzmq could not make one (each
    /// [`socket`](Self::socket) call then fails with it).
    raw: std::result::Result<Arc<RawContext>, Error>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.raw {
            Ok(raw) => write!(f, "Context({:p})", raw.0),
            Err(e) => write!(f, "Context(failed: {e})"),
        }
    }
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

impl Context {
    /// A new context. If libzmq cannot make one (out of file descriptors
    /// for its signalling pipes), the failure surfaces at the first
    /// [`socket`](Self::socket) call rather than here.
    pub fn new() -> Self {
        // SAFETY: zmq_ctx_new takes nothing; it returns a new context, or
        // null with errno set.
        let ptr = unsafe { sys::zmq_ctx_new() };
        let raw = if ptr.is_null() {
            Err(Error::last())
        } else {
            Ok(Arc::new(RawContext(ptr)))
        };
        Self { raw }
    }

    /// A new socket of `kind` in this context.
    pub fn socket(&self, kind: SocketType) -> Result<Socket> {
        let ctx = self.raw.as_ref().map_err(|e| *e)?;
        // SAFETY: the context is live (we hold it) and not terminated: it
        // is terminated only when the last Arc drops.
        let ptr = unsafe { sys::zmq_socket(ctx.0, kind.to_raw()) };
        if ptr.is_null() {
            return Err(Error::last());
        }
        Ok(Socket {
            ptr,
            _ctx: Arc::clone(ctx),
        })
    }
}

/// A ZeroMQ socket. It may move between threads (`Send`) but not be used
/// from two at once (not `Sync`), as libzmq requires. It keeps its
/// context alive, and is closed when dropped.
pub struct Socket {
    ptr: *mut c_void,
    /// Keeps the context from being terminated while this socket is open;
    /// dropped after `Drop::drop` closed the socket.
    _ctx: Arc<RawContext>,
}

// SAFETY: libzmq lets a socket migrate from one thread to another if a
// full memory barrier separates its uses there (`zmq_socket(3)`), which
// moving a value between threads in Rust implies (the move is published
// through a synchronising primitive: a spawn, a channel, a lock). `Socket`
// is not `Sync`, so two threads never use it at once.
unsafe impl Send for Socket {}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Socket({:p})", self.ptr)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the socket is open and closed once, here; its context is
        // still held (`_ctx` drops after this).
        unsafe { sys::zmq_close(self.ptr) };
    }
}

/// `rc` as a result: -1 is the thread's last error.
fn check(rc: c_int) -> Result<c_int> {
    if rc == -1 {
        Err(Error::last())
    } else {
        Ok(rc)
    }
}

/// An endpoint as C text; one with a NUL inside (which could only come
/// from a peer's message) is EINVAL, as libzmq says of any endpoint it
/// cannot parse.
fn endpoint_text(endpoint: &str) -> Result<CString> {
    CString::new(endpoint).map_err(|_| Error::EINVAL)
}

/// Writes the socket-option setters: each a documented `set_*` method
/// that hands its value to libzmq under one option, through the writer
/// for its type (`set_int`, `set_bool`, `set_i64`, `set_raw`,
/// `set_text`). A macro because each setter is a method of its own name,
/// and only the name, the option and the writer differ.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($ty:ty) => $writer:ident($option:ident);)*) => {$(
        $(#[$doc])*
        pub fn $name(&self, value: $ty) -> Result<()> {
            self.$writer(sys::$option, value)
        }
    )*};
}

impl Socket {
    /// Calls `f` (one of zmq_bind, zmq_connect, ...) on `endpoint`.
    fn endpoint_call(
        &self,
        endpoint: &str,
        f: unsafe extern "C" fn(*mut c_void, *const std::ffi::c_char) -> c_int,
    ) -> Result<()> {
        let text = endpoint_text(endpoint)?;
        // SAFETY: the socket is open, `text` is NUL-terminated and outlives
        // the call, which only reads it.
        check(unsafe { f(self.ptr, text.as_ptr()) }).map(drop)
    }

    /// Listens at `endpoint` (`tcp://host:port`, `ipc://path`,
    /// `inproc://name`).
    pub fn bind(&self, endpoint: &str) -> Result<()> {
        self.endpoint_call(endpoint, sys::zmq_bind)
    }

    /// Stops listening at `endpoint`, bound before.
    pub fn unbind(&self, endpoint: &str) -> Result<()> {
        self.endpoint_call(endpoint, sys::zmq_unbind)
    }

    /// Connects to `endpoint` (in the background: it succeeds before the
    /// peer is reached, and libzmq reconnects by itself).
    pub fn connect(&self, endpoint: &str) -> Result<()> {
        self.endpoint_call(endpoint, sys::zmq_connect)
    }

    /// Drops the connection to `endpoint`, made before.
    pub fn disconnect(&self, endpoint: &str) -> Result<()> {
        self.endpoint_call(endpoint, sys::zmq_disconnect)
    }

    /// Publishes this socket's `events` (a mask of
    /// [`SocketEvent`](super::SocketEvent) values) on a PAIR socket libzmq
    /// binds at the `inproc://` endpoint `endpoint`; connect a PAIR socket
    /// of the same context there to read them
    /// ([`MonitorEvent`](super::MonitorEvent)).
    pub fn monitor(&self, endpoint: &str, events: i32) -> Result<()> {
        let text = endpoint_text(endpoint)?;
        // SAFETY: the socket is open, `text` is NUL-terminated and outlives
        // the call.
        check(unsafe { sys::zmq_socket_monitor(self.ptr, text.as_ptr(), events) }).map(drop)
    }

    /// Sends `data` as one frame (a copy of it); `flags`: [`DONTWAIT`]
    /// (EAGAIN rather than wait for room), [`SNDMORE`] (more frames of
    /// this message follow).
    ///
    /// [`DONTWAIT`]: super::DONTWAIT
    /// [`SNDMORE`]: super::SNDMORE
    pub fn send<T: AsRef<[u8]>>(&self, data: T, flags: i32) -> Result<()> {
        let data = data.as_ref();
        // SAFETY: the socket is open; `data` is valid for its length during
        // the call, which copies it.
        check(unsafe { sys::zmq_send(self.ptr, data.as_ptr().cast(), data.len(), flags) }).map(drop)
    }

    /// Sends the frames of `parts` as one message (all or none of it is
    /// queued); `flags` apply to each frame. No frames send nothing.
    pub fn send_multipart<I, T>(&self, parts: I, flags: i32) -> Result<()>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let mut parts = parts.into_iter().peekable();
        while let Some(part) = parts.next() {
            let more = if parts.peek().is_some() {
                sys::ZMQ_SNDMORE
            } else {
                0
            };
            self.send(part, flags | more)?;
        }
        Ok(())
    }

    /// Receives one frame into `msg` (replacing what it held).
    pub fn recv(&self, msg: &mut Message, flags: i32) -> Result<()> {
        // SAFETY: the socket is open and `msg` is an initialised message,
        // which libzmq releases and refills (or leaves empty on failure).
        check(unsafe { sys::zmq_msg_recv(msg.as_raw_mut(), self.ptr, flags) }).map(drop)
    }

    /// Receives one frame into `buf`; its full length, which is more than
    /// `buf.len()` if it was truncated to fit.
    pub fn recv_into(&self, buf: &mut [u8], flags: i32) -> Result<usize> {
        // SAFETY: the socket is open; `buf` is writable for its length,
        // and libzmq writes at most that.
        let n =
            check(unsafe { sys::zmq_recv(self.ptr, buf.as_mut_ptr().cast(), buf.len(), flags) })?;
        // Not negative: -1 was the error above, and libzmq returns no other.
        Ok(n as usize)
    }

    /// Receives one frame as a message.
    pub fn recv_msg(&self, flags: i32) -> Result<Message> {
        let mut msg = Message::new();
        self.recv(&mut msg, flags)?;
        Ok(msg)
    }

    /// Receives one frame as bytes.
    pub fn recv_bytes(&self, flags: i32) -> Result<Vec<u8>> {
        self.recv_msg(flags).map(|m| m.to_vec())
    }

    /// Receives a whole message, each frame as bytes (`flags` apply to
    /// the first; the rest have arrived with it).
    pub fn recv_multipart(&self, flags: i32) -> Result<Vec<Vec<u8>>> {
        let mut parts = Vec::new();
        let mut msg = Message::new();
        loop {
            self.recv(&mut msg, flags)?;
            parts.push(msg.to_vec());
            if !msg.get_more() {
                return Ok(parts);
            }
        }
    }

    /// An item for [`poll`](super::poll()) that waits for `events` of this
    /// socket.
    pub fn as_poll_item(&self, events: PollEvents) -> PollItem<'_> {
        PollItem::from_socket(self, events)
    }

    /// Waits up to `timeout_ms` (-1: forever) for `events` of this socket
    /// alone; 1 if one occurred, 0 if the time ran out.
    pub fn poll(&self, events: PollEvents, timeout_ms: i64) -> Result<i32> {
        poll(&mut [self.as_poll_item(events)], timeout_ms)
    }

    pub(super) fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    fn set_raw(&self, option: c_int, value: &[u8]) -> Result<()> {
        // SAFETY: the socket is open; libzmq reads `value.len()` bytes of
        // `value` and checks the length against the option's.
        check(unsafe { sys::zmq_setsockopt(self.ptr, option, value.as_ptr().cast(), value.len()) })
            .map(drop)
    }

    fn set_int(&self, option: c_int, value: c_int) -> Result<()> {
        self.set_raw(option, &value.to_ne_bytes())
    }

    fn set_bool(&self, option: c_int, value: bool) -> Result<()> {
        self.set_int(option, c_int::from(value))
    }

    fn set_i64(&self, option: c_int, value: i64) -> Result<()> {
        self.set_raw(option, &value.to_ne_bytes())
    }

    fn set_text(&self, option: c_int, value: &str) -> Result<()> {
        self.set_raw(option, value.as_bytes())
    }

    /// Reads an option into `buf`; the length libzmq wrote.
    fn get_raw(&self, option: c_int, buf: &mut [u8]) -> Result<usize> {
        let mut len = buf.len();
        // SAFETY: the socket is open; libzmq writes at most `len` bytes
        // into `buf` (EINVAL if the value does not fit) and sets `len` to
        // what it wrote.
        check(unsafe { sys::zmq_getsockopt(self.ptr, option, buf.as_mut_ptr().cast(), &mut len) })?;
        Ok(len.min(buf.len()))
    }

    fn get_int(&self, option: c_int) -> Result<c_int> {
        let mut buf = [0u8; std::mem::size_of::<c_int>()];
        self.get_raw(option, &mut buf)?;
        Ok(c_int::from_ne_bytes(buf))
    }

    /// A string option (libzmq writes it with its NUL), grown until it fits.
    fn get_text(&self, option: c_int) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        loop {
            match self.get_raw(option, &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    if buf.last() == Some(&0) {
                        buf.pop();
                    }
                    return Ok(buf);
                }
                // Too small for the value: an `inproc://` name may be long.
                Err(Error::EINVAL) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
                Err(e) => return Err(e),
            }
        }
    }

    setters! {
        /// ZMQ_LINGER: how long closing (and the context's termination) waits
        /// for queued messages to go out, in ms; -1 forever, 0 not at all.
        set_linger(i32) => set_int(ZMQ_LINGER);
        /// ZMQ_MAXMSGSIZE: the largest message a peer may send, in bytes,
        /// before libzmq drops its connection; -1 for no limit.
        set_maxmsgsize(i64) => set_i64(ZMQ_MAXMSGSIZE);
        /// ZMQ_IPV6: `tcp://` over IPv6 as well as IPv4.
        set_ipv6(bool) => set_bool(ZMQ_IPV6);
        /// ZMQ_SNDTIMEO: how long a send waits for room, in ms, before it fails
        /// with EAGAIN; -1 forever.
        set_sndtimeo(i32) => set_int(ZMQ_SNDTIMEO);
        /// ZMQ_RCVTIMEO: how long a receive waits, in ms, before it fails with
        /// EAGAIN; -1 forever.
        set_rcvtimeo(i32) => set_int(ZMQ_RCVTIMEO);
        /// ZMQ_SNDHWM: messages queued per peer before sends wait (0: no
        /// limit).
        set_sndhwm(i32) => set_int(ZMQ_SNDHWM);
        /// ZMQ_RCVHWM: messages queued per peer on receipt (0: no limit).
        set_rcvhwm(i32) => set_int(ZMQ_RCVHWM);
        /// ZMQ_RECONNECT_IVL: the first wait before reconnecting, in ms.
        set_reconnect_ivl(i32) => set_int(ZMQ_RECONNECT_IVL);
        /// ZMQ_CONNECT_TIMEOUT: how long a TCP connect may hang, in ms, before
        /// it counts as failed; 0 for the OS's.
        set_connect_timeout(i32) => set_int(ZMQ_CONNECT_TIMEOUT);
        /// ZMQ_ROUTER_MANDATORY: a ROUTER fails a send to an unknown peer
        /// (EHOSTUNREACH) rather than drop it.
        set_router_mandatory(bool) => set_bool(ZMQ_ROUTER_MANDATORY);
        /// ZMQ_IMMEDIATE: queue messages only to completed connections.
        set_immediate(bool) => set_bool(ZMQ_IMMEDIATE);
        /// ZMQ_CURVE_SERVER: serve CURVE (needs the secret key too).
        set_curve_server(bool) => set_bool(ZMQ_CURVE_SERVER);
        /// ZMQ_CURVE_PUBLICKEY: this side's public key, 32 bytes (or 40
        /// characters of Z85).
        set_curve_publickey(&[u8]) => set_raw(ZMQ_CURVE_PUBLICKEY);
        /// ZMQ_CURVE_SECRETKEY: this side's secret key, 32 bytes (or 40
        /// characters of Z85).
        set_curve_secretkey(&[u8]) => set_raw(ZMQ_CURVE_SECRETKEY);
        /// ZMQ_CURVE_SERVERKEY: on a client, the server's public key, 32 bytes
        /// (or 40 characters of Z85).
        set_curve_serverkey(&[u8]) => set_raw(ZMQ_CURVE_SERVERKEY);
        /// ZMQ_ZAP_DOMAIN: the domain this socket's connections are
        /// authenticated in by the context's ZAP handler.
        set_zap_domain(&str) => set_text(ZMQ_ZAP_DOMAIN);
    }

    /// ZMQ_RCVMORE: more frames of the message being received follow.
    pub fn get_rcvmore(&self) -> Result<bool> {
        self.get_int(sys::ZMQ_RCVMORE).map(|v| v != 0)
    }

    /// ZMQ_EVENTS: what the socket is ready for now ([`POLLIN`],
    /// [`POLLOUT`]).
    ///
    /// [`POLLIN`]: super::POLLIN
    /// [`POLLOUT`]: super::POLLOUT
    pub fn get_events(&self) -> Result<PollEvents> {
        let v = self.get_int(sys::ZMQ_EVENTS)?;
        Ok(PollEvents::from_bits_truncate(v as i16))
    }

    /// ZMQ_FD: a file descriptor that becomes readable when the socket's
    /// events may have changed (edge-triggered: read
    /// [`get_events`](Self::get_events) after it fires).
    pub fn get_fd(&self) -> Result<RawFd> {
        self.get_int(sys::ZMQ_FD)
    }

    /// ZMQ_LAST_ENDPOINT: the endpoint last bound, resolved (a tcp port 0
    /// as the port chosen); `Err(bytes)` if it is not UTF-8.
    pub fn get_last_endpoint(&self) -> Result<std::result::Result<String, Vec<u8>>> {
        let text = self.get_text(sys::ZMQ_LAST_ENDPOINT)?;
        Ok(String::from_utf8(text).map_err(|e| e.into_bytes()))
    }
}
