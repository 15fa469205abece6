//! Raw bindings to libzmq (4.3), built from source with CURVE by this
//! crate's build script.
//!
//! Hand-written from `zmq.h`, and only as much of it as ferry calls: the
//! context, sockets and their options, messages, polling, socket
//! monitoring, CURVE keys and capability checks. The safe API over them
//! is `tensorferry_zmq::zmq`; every function here is `unsafe` and follows
//! libzmq's own rules (see its manual pages, `zmq_socket(3)` and so on).
//!
//! The native library is linked by the build script (`links = "zmq"`):
//! libzmq and libsodium as static archives, and the C++ runtime.

#![no_std]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_long, c_short, c_void};

/// A message (`zmq_msg_t`): 64 bytes libzmq owns the layout of, aligned
/// as `zmq.h` aligns them (to a pointer's size; 8 bytes here serves every
/// target). Initialise with [`zmq_msg_init`] or [`zmq_msg_init_size`]
/// before any other call, and release with [`zmq_msg_close`].
///
/// Not `Copy`: two copies of one initialised message would release its
/// content twice.
#[repr(C, align(8))]
pub struct zmq_msg_t {
    _opaque: [u8; 64],
}

impl zmq_msg_t {
    /// Storage for a message, not yet initialised as one.
    pub const fn zeroed() -> Self {
        Self { _opaque: [0; 64] }
    }
}

/// A file descriptor as libzmq polls it (`zmq_fd_t`; a socket handle on
/// Windows, which ferry does not build for).
pub type zmq_fd_t = c_int;

/// One entry of [`zmq_poll`]'s set: a ZeroMQ socket, or (with `socket`
/// null) a file descriptor, the events wanted and, after the call, the
/// events that occurred.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct zmq_pollitem_t {
    /// The ZeroMQ socket, or null to poll `fd`.
    pub socket: *mut c_void,
    /// The file descriptor, used when `socket` is null.
    pub fd: zmq_fd_t,
    /// The events to wait for (`ZMQ_POLLIN`, ...).
    pub events: c_short,
    /// The events that occurred, set by [`zmq_poll`].
    pub revents: c_short,
}

/// Base of the error numbers libzmq defines itself (beyond the OS's).
pub const ZMQ_HAUSNUMERO: c_int = 156_384_712;
/// The operation cannot be done in the socket's current state (for
/// example a REQ socket sending twice).
pub const EFSM: c_int = ZMQ_HAUSNUMERO + 51;
/// The transport protocol does not suit the socket type.
pub const ENOCOMPATPROTO: c_int = ZMQ_HAUSNUMERO + 52;
/// The context was terminated.
pub const ETERM: c_int = ZMQ_HAUSNUMERO + 53;
/// No I/O thread is available for the operation.
pub const EMTHREAD: c_int = ZMQ_HAUSNUMERO + 54;

/// Socket type: exclusive pair.
pub const ZMQ_PAIR: c_int = 0;
/// Socket type: publisher.
pub const ZMQ_PUB: c_int = 1;
/// Socket type: subscriber.
pub const ZMQ_SUB: c_int = 2;
/// Socket type: request (strict send, receive alternation).
pub const ZMQ_REQ: c_int = 3;
/// Socket type: reply (strict receive, send alternation).
pub const ZMQ_REP: c_int = 4;
/// Socket type: asynchronous request, load-balanced.
pub const ZMQ_DEALER: c_int = 5;
/// Socket type: asynchronous reply, routed by peer identity.
pub const ZMQ_ROUTER: c_int = 6;
/// Socket type: pipeline receiver.
pub const ZMQ_PULL: c_int = 7;
/// Socket type: pipeline sender.
pub const ZMQ_PUSH: c_int = 8;
/// Socket type: publisher that sees subscriptions.
pub const ZMQ_XPUB: c_int = 9;
/// Socket type: subscriber that sends subscriptions as messages.
pub const ZMQ_XSUB: c_int = 10;
/// Socket type: raw TCP.
pub const ZMQ_STREAM: c_int = 11;

/// Option: the socket's routing identity (bytes).
pub const ZMQ_ROUTING_ID: c_int = 5;
/// Option (read): more frames of the current message follow (int).
pub const ZMQ_RCVMORE: c_int = 13;
/// Option (read): the file descriptor that signals the socket's events.
pub const ZMQ_FD: c_int = 14;
/// Option (read): the events the socket is ready for (int, `ZMQ_POLL*`).
pub const ZMQ_EVENTS: c_int = 15;
/// Option (read): the socket's type (int).
pub const ZMQ_TYPE: c_int = 16;
/// Option: how long closing waits for queued messages, in ms (int).
pub const ZMQ_LINGER: c_int = 17;
/// Option: first reconnection interval, in ms (int).
pub const ZMQ_RECONNECT_IVL: c_int = 18;
/// Option: largest inbound message, in bytes; -1 for none (int64).
pub const ZMQ_MAXMSGSIZE: c_int = 22;
/// Option: outbound high-water mark, in messages (int).
pub const ZMQ_SNDHWM: c_int = 23;
/// Option: inbound high-water mark, in messages (int).
pub const ZMQ_RCVHWM: c_int = 24;
/// Option: receive timeout, in ms; -1 waits forever (int).
pub const ZMQ_RCVTIMEO: c_int = 27;
/// Option: send timeout, in ms; -1 waits forever (int).
pub const ZMQ_SNDTIMEO: c_int = 28;
/// Option (read): the endpoint last bound, as resolved (string).
pub const ZMQ_LAST_ENDPOINT: c_int = 32;
/// Option: a ROUTER fails (EHOSTUNREACH) rather than drops a message to
/// an unknown peer (int).
pub const ZMQ_ROUTER_MANDATORY: c_int = 33;
/// Option: queue messages only to completed connections (int).
pub const ZMQ_IMMEDIATE: c_int = 39;
/// Option: IPv6 as well as IPv4 on `tcp://` (int).
pub const ZMQ_IPV6: c_int = 42;
/// Option: act as a CURVE server (int).
pub const ZMQ_CURVE_SERVER: c_int = 47;
/// Option: this side's long-term CURVE public key (32 bytes or 40 of Z85).
pub const ZMQ_CURVE_PUBLICKEY: c_int = 48;
/// Option: this side's long-term CURVE secret key (32 bytes or 40 of Z85).
pub const ZMQ_CURVE_SECRETKEY: c_int = 49;
/// Option: the server's long-term CURVE public key, on a client.
pub const ZMQ_CURVE_SERVERKEY: c_int = 50;
/// Option: the ZAP domain, which makes libzmq authenticate connections
/// through the context's ZAP handler (string).
pub const ZMQ_ZAP_DOMAIN: c_int = 55;
/// Option: how long a TCP connect may take, in ms; 0 for the OS's (int).
pub const ZMQ_CONNECT_TIMEOUT: c_int = 79;

/// Message property: more frames follow.
pub const ZMQ_MORE: c_int = 1;

/// Send and receive flag: do not wait (EAGAIN instead).
pub const ZMQ_DONTWAIT: c_int = 1;
/// Send flag: more frames of this message follow.
pub const ZMQ_SNDMORE: c_int = 2;

/// Poll event: a message can be received (or the fd read).
pub const ZMQ_POLLIN: c_short = 1;
/// Poll event: a message can be sent (or the fd written).
pub const ZMQ_POLLOUT: c_short = 2;
/// Poll event: an error condition on a file descriptor.
pub const ZMQ_POLLERR: c_short = 4;
/// Poll event: urgent data on a file descriptor.
pub const ZMQ_POLLPRI: c_short = 8;

/// Monitor event: a connection was made.
pub const ZMQ_EVENT_CONNECTED: c_int = 0x0001;
/// Monitor event: a connect is pending.
pub const ZMQ_EVENT_CONNECT_DELAYED: c_int = 0x0002;
/// Monitor event: a connect failed, and is tried again after an interval.
pub const ZMQ_EVENT_CONNECT_RETRIED: c_int = 0x0004;
/// Monitor event: the socket listens on an endpoint.
pub const ZMQ_EVENT_LISTENING: c_int = 0x0008;
/// Monitor event: a bind failed.
pub const ZMQ_EVENT_BIND_FAILED: c_int = 0x0010;
/// Monitor event: a connection was accepted.
pub const ZMQ_EVENT_ACCEPTED: c_int = 0x0020;
/// Monitor event: accepting a connection failed.
pub const ZMQ_EVENT_ACCEPT_FAILED: c_int = 0x0040;
/// Monitor event: a connection's socket was closed.
pub const ZMQ_EVENT_CLOSED: c_int = 0x0080;
/// Monitor event: closing a connection's socket failed.
pub const ZMQ_EVENT_CLOSE_FAILED: c_int = 0x0100;
/// Monitor event: a connection was lost.
pub const ZMQ_EVENT_DISCONNECTED: c_int = 0x0200;
/// Monitor event: monitoring stopped.
pub const ZMQ_EVENT_MONITOR_STOPPED: c_int = 0x0400;
/// Monitor event: a handshake failed, for no reason given.
pub const ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: c_int = 0x0800;
/// Monitor event: a handshake (and its authentication) succeeded.
pub const ZMQ_EVENT_HANDSHAKE_SUCCEEDED: c_int = 0x1000;
/// Monitor event: a handshake failed on a protocol error.
pub const ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL: c_int = 0x2000;
/// Monitor event: a handshake failed authentication.
pub const ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: c_int = 0x4000;
/// Monitor events: all of them.
pub const ZMQ_EVENT_ALL: c_int = 0xFFFF;

extern "C" {
    /// The error number of the calling thread's last failed libzmq call.
    pub fn zmq_errno() -> c_int;
    /// The text of an error number (the OS's or libzmq's own).
    pub fn zmq_strerror(errnum: c_int) -> *const c_char;
    /// The library's version.
    pub fn zmq_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int);
    /// 1 if the library has `capability` (`"curve"`, `"ipc"`, ...), else 0.
    pub fn zmq_has(capability: *const c_char) -> c_int;

    /// A new context, or null (errno set).
    pub fn zmq_ctx_new() -> *mut c_void;
    /// Terminates a context: blocks until every socket of it is closed
    /// and their lingering messages are sent or dropped. -1 with EINTR if
    /// a signal interrupted it (call again).
    pub fn zmq_ctx_term(context: *mut c_void) -> c_int;

    /// A new socket of `kind` in `context`, or null (errno set).
    pub fn zmq_socket(context: *mut c_void, kind: c_int) -> *mut c_void;
    /// Closes a socket; it must not be used again.
    pub fn zmq_close(socket: *mut c_void) -> c_int;
    /// Sets an option from `len` bytes at `value`.
    pub fn zmq_setsockopt(
        socket: *mut c_void,
        option: c_int,
        value: *const c_void,
        len: usize,
    ) -> c_int;
    /// Reads an option into `*len` bytes at `value`; `*len` becomes its
    /// length (EINVAL if it does not fit).
    pub fn zmq_getsockopt(
        socket: *mut c_void,
        option: c_int,
        value: *mut c_void,
        len: *mut usize,
    ) -> c_int;
    /// Binds to a NUL-terminated endpoint.
    pub fn zmq_bind(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    /// Stops listening on an endpoint bound before.
    pub fn zmq_unbind(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    /// Connects to a NUL-terminated endpoint.
    pub fn zmq_connect(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    /// Drops a connection made before.
    pub fn zmq_disconnect(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    /// Queues a copy of `len` bytes as one frame; the frame's length, or -1.
    pub fn zmq_send(socket: *mut c_void, buf: *const c_void, len: usize, flags: c_int) -> c_int;
    /// Receives one frame into `len` bytes (truncating); the frame's full
    /// length, or -1.
    pub fn zmq_recv(socket: *mut c_void, buf: *mut c_void, len: usize, flags: c_int) -> c_int;
    /// Publishes the socket's events (`events`, a mask of `ZMQ_EVENT_*`) on
    /// a PAIR socket bound at the `inproc://` endpoint `addr`.
    pub fn zmq_socket_monitor(socket: *mut c_void, addr: *const c_char, events: c_int) -> c_int;

    /// Initialises an empty message.
    pub fn zmq_msg_init(msg: *mut zmq_msg_t) -> c_int;
    /// Initialises a message of `size` bytes (uninitialised content).
    pub fn zmq_msg_init_size(msg: *mut zmq_msg_t, size: usize) -> c_int;
    /// Receives a frame into an initialised message (its old content is
    /// released); the frame's length, or -1 (the message then empty).
    pub fn zmq_msg_recv(msg: *mut zmq_msg_t, socket: *mut c_void, flags: c_int) -> c_int;
    /// Releases a message.
    pub fn zmq_msg_close(msg: *mut zmq_msg_t) -> c_int;
    /// The message's content (valid while the message is neither closed
    /// nor received into again).
    pub fn zmq_msg_data(msg: *mut zmq_msg_t) -> *mut c_void;
    /// The message's length in bytes.
    pub fn zmq_msg_size(msg: *const zmq_msg_t) -> usize;
    /// 1 if more frames follow this one.
    pub fn zmq_msg_more(msg: *const zmq_msg_t) -> c_int;
    /// A metadata property of a received message (`"User-Id"`,
    /// `"Peer-Address"`, ...), NUL-terminated and owned by the message, or
    /// null if it has none.
    pub fn zmq_msg_gets(msg: *const zmq_msg_t, property: *const c_char) -> *const c_char;

    /// Waits up to `timeout` ms (-1: forever) for an event of `nitems`
    /// items; the number of items with events, or -1.
    pub fn zmq_poll(items: *mut zmq_pollitem_t, nitems: c_int, timeout: c_long) -> c_int;

    /// A new CURVE key pair as two 40-character Z85 texts, each written
    /// with its NUL into 41 bytes. -1 with ENOTSUP without CURVE.
    pub fn zmq_curve_keypair(z85_public: *mut c_char, z85_secret: *mut c_char) -> c_int;
    /// Decodes NUL-terminated Z85 text (a multiple of 5 characters) into
    /// `dest` (4/5 of its length); `dest`, or null if it is not Z85.
    pub fn zmq_z85_decode(dest: *mut u8, string: *const c_char) -> *mut u8;
}
