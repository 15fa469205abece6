//! The sockets a notification stream runs on: TCP between hosts, and a
//! Unix socket between engines of one host.
//!
//! An inbox bound on TCP `host:port` also binds the abstract Unix socket
//! named for that endpoint ([`local_name`]); a sender tries it first and
//! takes TCP if nothing answers. Abstract Unix names belong to a network
//! namespace, as TCP ports do, so the name answers exactly where the TCP
//! endpoint reaches this engine: from its own network namespace. A Unix
//! connection is held to the allow-list as loopback's address or the
//! inbox's own (a process of this host can reach the TCP inbox from either
//! anyway), and under CURVE runs the same handshake. A sender takes a Unix
//! name only from a process of its own user: another user could have
//! bound the name of an endpoint first (of another host, say).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

/// The abstract Unix socket address an inbox bound on TCP `host_port`
/// also listens on.
pub(super) fn local_name(host_port: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("tensorferry-notify/{host_port}"))
}

/// Connects to this host's inbox named for `host_port`, if one of this
/// process's user listens there.
pub(super) fn connect_local(host_port: &str) -> Option<UnixStream> {
    let s = UnixStream::connect_addr(&local_name(host_port).ok()?).ok()?;
    same_user(&s).then_some(s)
}

/// True if the process at the other end of `s` runs as this one's user.
fn same_user(s: &UnixStream) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills the ucred it is given, its size given;
    // the descriptor is `s`'s, open for the call.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut len,
        )
    };
    // SAFETY: getuid has no preconditions.
    rc == 0 && cred.uid == unsafe { libc::getuid() }
}

/// Writes `buf` to the socket `fd` without raising SIGPIPE when its peer
/// is gone (an error instead), as std's TCP writes do.
fn send(fd: RawFd, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for its length; `fd` is a socket its owner
    // keeps open for the call.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// An outbox's connected socket.
pub(super) enum Stream {
    /// To another host's inbox, or one this host's Unix name did not reach.
    Tcp(TcpStream),
    /// To an inbox of this host.
    Unix(UnixStream),
}

impl Stream {
    /// Sets both timeouts of a socket still blocking (its connection and
    /// handshake).
    pub(super) fn set_timeouts(&self, wait: std::time::Duration) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s
                .set_read_timeout(Some(wait))
                .and_then(|()| s.set_write_timeout(Some(wait))),
            Self::Unix(s) => s
                .set_read_timeout(Some(wait))
                .and_then(|()| s.set_write_timeout(Some(wait))),
        }
    }

    /// Makes writes return at once with what the socket took.
    pub(super) fn set_nonblocking(&self) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_nonblocking(true),
            Self::Unix(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        send(self.as_raw_fd(), buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// An inbox's accepted connection.
pub(super) enum Accepted {
    /// From another host, or this one by TCP.
    Tcp(mio::net::TcpStream),
    /// From this host, by the inbox's Unix name.
    Unix(mio::net::UnixStream),
}

impl Accepted {
    /// The socket, for the poll's registry.
    pub(super) fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Self::Tcp(s) => s,
            Self::Unix(s) => s,
        }
    }
}

impl Read for Accepted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Accepted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let fd = match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        };
        send(fd, buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
