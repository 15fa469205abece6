//! The socket calls of the channel: endpoints to socket paths, creating,
//! connecting, and sending one packet; and the mapping of their errors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::SEND_TIMEOUT;
use crate::error::UdsError;

/// The socket path of an endpoint (`ipc://<path>` or a bare path).
pub(super) fn path_of(endpoint: &str) -> Result<&str, UdsError> {
    let path = endpoint.strip_prefix("ipc://").unwrap_or(endpoint);
    let bad = |why| UdsError::BadEndpoint {
        endpoint: endpoint.to_owned(),
        why,
    };
    if path.is_empty() || path.contains("://") {
        return Err(bad("not ipc://<path>"));
    }
    // sun_path holds 108 bytes, the terminating NUL included.
    if path.len() >= 108 || path.as_bytes().contains(&0) {
        return Err(bad("socket path longer than 107 bytes or holding NUL"));
    }
    Ok(path)
}

pub(super) fn sockaddr(path: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path.iter_mut().zip(path.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    (a, len as libc::socklen_t)
}

pub(super) fn socket(endpoint: &str, nonblocking: bool) -> Result<OwnedFd, UdsError> {
    let flags = libc::SOCK_SEQPACKET
        | libc::SOCK_CLOEXEC
        | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_UNIX, flags, 0) };
    if fd < 0 {
        return Err(sys("socket", endpoint));
    }
    // SAFETY: fd was just returned by socket(); we own it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What [`at_path`] does with a socket: bind it or connect it.
#[derive(Clone, Copy, Debug)]
pub(super) enum AddrCall {
    /// `bind(2)`.
    Bind,
    /// `connect(2)`.
    Connect,
}

/// Binds or connects `fd` to the socket file at `path`; what the call
/// returned.
pub(super) fn at_path(fd: &OwnedFd, path: &str, call: AddrCall) -> libc::c_int {
    let (addr, len) = sockaddr(path);
    let call = match call {
        AddrCall::Bind => libc::bind,
        AddrCall::Connect => libc::connect,
    };
    // SAFETY: `call` is bind or connect, which read `len` bytes at the
    // address; addr is a valid sockaddr_un of `len` bytes, and fd an open
    // socket.
    unsafe {
        call(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    }
}

pub(super) fn sys(call: &'static str, endpoint: &str) -> UdsError {
    UdsError::Sys {
        call,
        endpoint: endpoint.to_owned(),
        source: io::Error::last_os_error(),
    }
}

pub(super) fn gone_or_sys(call: &'static str, endpoint: &str) -> UdsError {
    let source = io::Error::last_os_error();
    match source.raw_os_error() {
        Some(
            libc::ENOENT | libc::ECONNREFUSED | libc::ECONNRESET | libc::EPIPE | libc::ENOTCONN,
        ) => UdsError::PeerGone {
            call,
            endpoint: endpoint.to_owned(),
            source,
        },
        _ => UdsError::Sys {
            call,
            endpoint: endpoint.to_owned(),
            source,
        },
    }
}

pub(super) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Connects to the listener at `path` (blocking, with a send timeout).
pub(super) fn connect(endpoint: &str, path: &str) -> Result<OwnedFd, UdsError> {
    let fd = socket(endpoint, false)?;
    if at_path(&fd, path, AddrCall::Connect) != 0 {
        return Err(gone_or_sys("connect", endpoint));
    }
    let tv = libc::timeval {
        tv_sec: SEND_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: SEND_TIMEOUT.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: tv is a valid timeval for SO_SNDTIMEO.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(sys("setsockopt(SO_SNDTIMEO)", endpoint));
    }
    Ok(fd)
}

/// Sends one packet without copying its parts together.
pub(super) fn send_packet(
    fd: &OwnedFd,
    endpoint: &str,
    timeout: Duration,
    kind: u8,
    magic: &[u8],
    payload: &[u8],
) -> Result<(), UdsError> {
    let magic_len = u8::try_from(magic.len()).map_err(|_| UdsError::BadEndpoint {
        endpoint: endpoint.to_owned(),
        why: "frame 0 longer than 255 bytes",
    })?;
    let header = [kind, magic_len];
    let mut iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut libc::c_void,
            iov_len: 2,
        },
        libc::iovec {
            iov_base: magic.as_ptr() as *mut libc::c_void,
            iov_len: magic.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
    ];
    // SAFETY: msghdr is plain old data; all-zero is valid (no address, no
    // control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: msg points at three iovecs over live buffers that sendmsg
    // only reads; MSG_NOSIGNAL turns a dead peer into EPIPE, not SIGPIPE.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n >= 0 {
        return Ok(());
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Err(UdsError::Timeout {
            endpoint: endpoint.to_owned(),
            millis: timeout.as_millis() as u64,
        }),
        Some(libc::EMSGSIZE) => Err(UdsError::TooLarge {
            from: endpoint.to_owned(),
            len: payload.len(),
            cap: 0,
        }),
        _ => Err(gone_or_sys("sendmsg", endpoint)),
    }
}
