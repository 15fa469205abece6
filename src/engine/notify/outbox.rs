//! One peer's outbox: the connection to its inbox, written from the
//! sending thread, with what the socket did not take yet.
//!
//! A send writes its frame straight to the socket (one `send` call, no
//! thread between). What the socket does not take waits in the outbox,
//! `NOTIFY_BACKLOG` bytes at most, and goes first on the next send or the
//! engine's next tick; so one connection keeps every sender thread's
//! frames in the order they were sent, and a slow peer costs the senders
//! nothing until its backlog is full. Past that, a send that may wait
//! waits for room (its own thread only, and never holding the outbox), and
//! one that may not fails at once.

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tensorferry_core::transport::FaultKind;
use tensorferry_zmq::{CurveKeyPair, CurvePublicKey};

use super::frame::{self, HEADER, NAME, NOTE, TAG};
use super::seal::Seal;
use super::socket::{connect_local, Stream as Socket};
use super::{lock, set_buffer, BUFFER, NOTIFY_BACKLOG as BACKLOG};
use crate::engine::EngineError;

/// How long opening a connection (and its handshake, under CURVE) may take.
const OPEN_WAIT: Duration = Duration::from_secs(5);

/// A peer's outbox.
pub(super) struct Outbox {
    stream: Mutex<Stream>,
    /// The socket's descriptor, to wait for room without the lock.
    fd: std::os::fd::RawFd,
    /// The inbox's endpoint, for errors.
    pub(super) endpoint: String,
    /// True while it is on the notifier's backlog list.
    pub(super) listed: AtomicBool,
}

struct Stream {
    socket: Socket,
    seal: Option<Seal>,
    /// The sender name last sent (a name frame goes first when it changes).
    named: String,
    /// Frames, or their tails, the socket has not taken, from `sent` on.
    backlog: Vec<u8>,
    sent: usize,
    /// A body being sealed.
    body: Vec<u8>,
}

/// Why a send did not go.
pub(super) enum Refused {
    /// The backlog is full: the peer reads too slowly or not at all.
    Full,
    /// The connection failed; the outbox is of no further use.
    Broken(std::io::Error),
    /// A frame could not be sealed.
    Seal(String),
}

impl Outbox {
    /// Connects to the inbox at `endpoint` (`host:port`), running the
    /// handshake with its key `server` under CURVE (`ours`: this engine's
    /// key pair).
    pub(super) fn open(
        endpoint: &str,
        keys: Option<(&CurveKeyPair, &CurvePublicKey)>,
    ) -> Result<Self, EngineError> {
        let failed = |kind, message: String| EngineError::Transport {
            verb: "connect a notification outbox",
            message: format!("{endpoint}: {message}"),
            kind,
        };
        // This host's inbox by its Unix name; any other by TCP.
        let mut socket = match connect_local(endpoint) {
            Some(s) => Socket::Unix(s),
            None => {
                let address = resolve(endpoint).map_err(|m| failed(FaultKind::UnknownPeer, m))?;
                let s = TcpStream::connect_timeout(&address, OPEN_WAIT).map_err(|e| {
                    let kind = match e.kind() {
                        ErrorKind::ConnectionRefused | ErrorKind::TimedOut => FaultKind::PeerGone,
                        _ => FaultKind::Io,
                    };
                    failed(kind, e.to_string())
                })?;
                s.set_nodelay(true)
                    .map_err(|e| failed(FaultKind::Io, e.to_string()))?;
                Socket::Tcp(s)
            }
        };
        socket
            .set_timeouts(OPEN_WAIT)
            .and_then(|()| set_buffer(&socket, libc::SO_SNDBUF, BUFFER))
            .map_err(|e| failed(FaultKind::Io, e.to_string()))?;
        let seal = match keys {
            Some((ours, theirs)) => Some(
                Seal::open(&mut socket, ours, theirs)
                    .map_err(|m| failed(FaultKind::UnknownPeer, m))?,
            ),
            None => None,
        };
        socket
            .set_nonblocking()
            .map_err(|e| failed(FaultKind::Io, e.to_string()))?;
        Ok(Self {
            fd: socket.as_raw_fd(),
            stream: Mutex::new(Stream {
                socket,
                seal,
                named: String::new(),
                backlog: Vec::new(),
                sent: 0,
                body: Vec::new(),
            }),
            endpoint: endpoint.to_owned(),
            listed: AtomicBool::new(false),
        })
    }

    /// Sends `message` as from `from`; waits for room until `until` if
    /// given, else fails at once when the backlog is full. Returns true if
    /// part of it waits in the backlog.
    pub(super) fn send(
        &self,
        from: &str,
        message: &[u8],
        until: Option<Instant>,
    ) -> Result<bool, Refused> {
        loop {
            {
                let mut s = lock(&self.stream);
                s.flush().map_err(Refused::Broken)?;
                if s.unsent() + s.frames_len(from, message.len()) <= BACKLOG {
                    s.put(from, message)?;
                    s.flush().map_err(Refused::Broken)?;
                    return Ok(s.unsent() > 0);
                }
            }
            let left = until
                .map(|u| u.saturating_duration_since(Instant::now()))
                .filter(|l| !l.is_zero())
                .ok_or(Refused::Full)?;
            self.wait_for_room(left);
        }
    }

    /// Writes what it can of the backlog without waiting; true if some is
    /// left. `None`: another thread holds the outbox (and writes it).
    pub(super) fn flush(&self) -> Option<Result<bool, std::io::Error>> {
        let mut s = match self.stream.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(s.flush().map(|()| s.unsent() > 0))
    }

    /// Writes the backlog, waiting for room until `until`; true if all of
    /// it went.
    pub(super) fn drain(&self, until: Instant) -> bool {
        loop {
            let flushed = {
                let mut s = lock(&self.stream);
                s.flush().map(|()| s.unsent())
            };
            match flushed {
                Ok(0) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.wait_for_room(left);
        }
    }

    /// True if its peer closed the connection (the engine is gone) and
    /// nothing waits to be sent: the outbox may go without reordering.
    pub(super) fn gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd we own; the descriptor belongs to this
        // outbox's socket, which lives as long as the outbox.
        let ready = unsafe { libc::poll(&mut p, 1, 0) } == 1;
        let closed = p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
        ready && closed && matches!(self.flush(), Some(Ok(false)))
    }

    fn wait_for_room(&self, most: Duration) {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = most.as_millis().clamp(1, 100) as i32;
        // SAFETY: one pollfd we own; the descriptor belongs to this
        // outbox's socket, which lives as long as the outbox.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}

impl Stream {
    fn unsent(&self) -> usize {
        self.backlog.len() - self.sent
    }

    /// The bytes `message`'s frames take, the name's frame included if it
    /// changed.
    fn frames_len(&self, from: &str, message: usize) -> usize {
        let tag = if self.seal.is_some() { TAG } else { 0 };
        let name = if self.named == from {
            0
        } else {
            HEADER + 1 + from.len() + tag
        };
        name + HEADER + 1 + message + tag
    }

    /// Appends the frames of `message` to the backlog.
    fn put(&mut self, from: &str, message: &[u8]) -> Result<(), Refused> {
        if self.sent > 0 {
            self.backlog.drain(..self.sent);
            self.sent = 0;
        }
        if self.named != from {
            self.frame(NAME, from.as_bytes())?;
            from.clone_into(&mut self.named);
        }
        self.frame(NOTE, message)
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) -> Result<(), Refused> {
        match &mut self.seal {
            Some(seal) => {
                self.body.clear();
                self.body.push(kind);
                self.body.extend_from_slice(payload);
                seal.put(&self.body, &mut self.backlog)
                    .map_err(Refused::Seal)
            }
            None => {
                frame::put_header(&mut self.backlog, 1 + payload.len());
                self.backlog.push(kind);
                self.backlog.extend_from_slice(payload);
                Ok(())
            }
        }
    }

    /// Writes what the socket takes of the backlog.
    fn flush(&mut self) -> Result<(), std::io::Error> {
        while self.sent < self.backlog.len() {
            match self.socket.write(&self.backlog[self.sent..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        self.backlog.clear();
        self.sent = 0;
        Ok(())
    }
}

/// The socket address of `host:port` (`[v6]:port` for IPv6).
fn resolve(endpoint: &str) -> Result<SocketAddr, String> {
    endpoint
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "names no address".to_owned())
}
