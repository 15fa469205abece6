//! [`Error`]: the error numbers libzmq's calls fail with.

use std::ffi::CStr;
use std::fmt;

use tensorferry_zmq_sys as sys;

/// A result of a libzmq call.
pub type Result<T> = std::result::Result<T, Error>;

/// What a libzmq call failed with: its error number, named where libzmq
/// documents it (the OS's numbers, and libzmq's own beyond them), and
/// any other as [`Error::Other`]. Displays as `zmq_strerror` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(clippy::upper_case_acronyms)] // the C names, as every manual page spells them
pub enum Error {
    /// Permission denied.
    EACCES,
    /// The address is already in use.
    EADDRINUSE,
    /// The address is not available (not local).
    EADDRNOTAVAIL,
    /// The address family is not supported.
    EAFNOSUPPORT,
    /// Not now: a non-blocking call would block, or a timeout ran out.
    EAGAIN,
    /// The resource is busy.
    EBUSY,
    /// The connection was aborted.
    ECONNABORTED,
    /// The peer refused the connection.
    ECONNREFUSED,
    /// The peer reset the connection.
    ECONNRESET,
    /// A bad address (a message not initialised).
    EFAULT,
    /// The peer is unreachable (a ROUTER's unknown peer, with
    /// `ROUTER_MANDATORY`).
    EHOSTUNREACH,
    /// The operation is in progress.
    EINPROGRESS,
    /// A signal interrupted the call.
    EINTR,
    /// An invalid argument (a malformed endpoint, a wrong option value).
    EINVAL,
    /// Too many open files (sockets of the context, or the process's).
    EMFILE,
    /// The message is too long.
    EMSGSIZE,
    /// The name is too long (an `ipc://` path).
    ENAMETOOLONG,
    /// The network is down.
    ENETDOWN,
    /// The network dropped the connection on reset.
    ENETRESET,
    /// The network is unreachable.
    ENETUNREACH,
    /// No buffer space is available.
    ENOBUFS,
    /// No such device (a network interface named in an endpoint).
    ENODEV,
    /// No such file or directory, or endpoint (an `inproc://` nobody bound).
    ENOENT,
    /// Out of memory.
    ENOMEM,
    /// Not supported (a capability this libzmq lacks, such as CURVE).
    ENOTSUP,
    /// The socket is not connected.
    ENOTCONN,
    /// Not a socket.
    ENOTSOCK,
    /// A protocol error.
    EPROTO,
    /// The transport is not supported (an unknown `scheme://`).
    EPROTONOSUPPORT,
    /// The operation timed out.
    ETIMEDOUT,
    /// Not in the socket's current state (libzmq's own).
    EFSM,
    /// The transport does not suit the socket type (libzmq's own).
    ENOCOMPATPROTO,
    /// The context was terminated (libzmq's own).
    ETERM,
    /// No I/O thread is available (libzmq's own).
    EMTHREAD,
    /// Any other error number.
    Other(i32),
}

/// Every named error with its number.
const NAMED: [(Error, i32); 34] = [
    (Error::EACCES, libc::EACCES),
    (Error::EADDRINUSE, libc::EADDRINUSE),
    (Error::EADDRNOTAVAIL, libc::EADDRNOTAVAIL),
    (Error::EAFNOSUPPORT, libc::EAFNOSUPPORT),
    (Error::EAGAIN, libc::EAGAIN),
    (Error::EBUSY, libc::EBUSY),
    (Error::ECONNABORTED, libc::ECONNABORTED),
    (Error::ECONNREFUSED, libc::ECONNREFUSED),
    (Error::ECONNRESET, libc::ECONNRESET),
    (Error::EFAULT, libc::EFAULT),
    (Error::EHOSTUNREACH, libc::EHOSTUNREACH),
    (Error::EINPROGRESS, libc::EINPROGRESS),
    (Error::EINTR, libc::EINTR),
    (Error::EINVAL, libc::EINVAL),
    (Error::EMFILE, libc::EMFILE),
    (Error::EMSGSIZE, libc::EMSGSIZE),
    (Error::ENAMETOOLONG, libc::ENAMETOOLONG),
    (Error::ENETDOWN, libc::ENETDOWN),
    (Error::ENETRESET, libc::ENETRESET),
    (Error::ENETUNREACH, libc::ENETUNREACH),
    (Error::ENOBUFS, libc::ENOBUFS),
    (Error::ENODEV, libc::ENODEV),
    (Error::ENOENT, libc::ENOENT),
    (Error::ENOMEM, libc::ENOMEM),
    (Error::ENOTSUP, libc::ENOTSUP),
    (Error::ENOTCONN, libc::ENOTCONN),
    (Error::ENOTSOCK, libc::ENOTSOCK),
    (Error::EPROTO, libc::EPROTO),
    (Error::EPROTONOSUPPORT, libc::EPROTONOSUPPORT),
    (Error::ETIMEDOUT, libc::ETIMEDOUT),
    (Error::EFSM, sys::EFSM),
    (Error::ENOCOMPATPROTO, sys::ENOCOMPATPROTO),
    (Error::ETERM, sys::ETERM),
    (Error::EMTHREAD, sys::EMTHREAD),
];

impl Error {
    /// The error of this number.
    pub fn from_raw(raw: i32) -> Self {
        NAMED
            .iter()
            .find(|(_, n)| *n == raw)
            .map_or(Self::Other(raw), |(e, _)| *e)
    }

    /// Its number.
    pub fn to_raw(self) -> i32 {
        match self {
            Self::Other(raw) => raw,
            named => NAMED
                .iter()
                .find(|(e, _)| *e == named)
                .map_or(0, |(_, n)| *n),
        }
    }

    /// The error of the calling thread's last failed libzmq call.
    pub(crate) fn last() -> Self {
        // SAFETY: zmq_errno takes nothing and reads the thread's errno.
        Self::from_raw(unsafe { sys::zmq_errno() })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: zmq_strerror accepts any number and returns a
        // NUL-terminated string: libzmq's own text for its numbers, else
        // strerror's, which glibc keeps in static storage or, for a number
        // it does not know, in a buffer of the calling thread. It is copied
        // out here before this thread makes another call.
        let text = unsafe { sys::zmq_strerror(self.to_raw()) };
        if text.is_null() {
            return write!(f, "error {}", self.to_raw());
        }
        // SAFETY: non-null, NUL-terminated, and valid until this thread's
        // next strerror (see above); read at once.
        let text = unsafe { CStr::from_ptr(text) };
        f.write_str(&text.to_string_lossy())
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::EFSM | Error::ENOCOMPATPROTO | Error::ETERM | Error::EMTHREAD => {
                std::io::Error::other(e)
            }
            e => std::io::Error::from_raw_os_error(e.to_raw()),
        }
    }
}
