//! ferry-core's `ControlChannel` for processes on one host: Unix
//! `SOCK_SEQPACKET` sockets.
//!
//! The layout mirrors sglang's ZeroMQ one: every process listens on its own
//! endpoint (`ipc://<path>`) and connects to the endpoints it sends to. A
//! packet keeps message boundaries, a connection's first packet names the
//! sender's endpoint (so the receiver knows who spoke, which a ZeroMQ PULL
//! socket cannot tell), and a connection that closes tells the receiver
//! that the peer's process is gone: its kernel closed the socket.
//!
//! Packet: `[kind: u8][magic length: u8][magic][payload]`, kind 1 = hello
//! (payload: the sender's endpoint), kind 2 = message.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend, Incoming};

use crate::error::UdsError;

const HELLO: u8 = 1;
const MESSAGE: u8 = 2;

/// How long a send waits for a peer whose queue is full.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// The socket path of an endpoint (`ipc://<path>` or a bare path).
fn path_of(endpoint: &str) -> Result<&str, UdsError> {
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

fn sockaddr(path: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in a.sun_path.iter_mut().zip(path.bytes()) {
        *d = s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    (a, len as libc::socklen_t)
}

fn socket(endpoint: &str, nonblocking: bool) -> Result<OwnedFd, UdsError> {
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

fn sys(call: &'static str, endpoint: &str) -> UdsError {
    UdsError::Sys {
        call,
        endpoint: endpoint.to_owned(),
        source: io::Error::last_os_error(),
    }
}

fn gone_or_sys(call: &'static str, endpoint: &str) -> UdsError {
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

/// A control channel bound to one endpoint.
#[derive(Debug)]
pub struct UdsChannel {
    sender: UdsSender,
    receiver: UdsReceiver,
}

impl UdsChannel {
    /// Listens on `endpoint` (`ipc://<path>`). A socket file left by a
    /// process that died is replaced; one in use is an error.
    pub fn bind(endpoint: &str) -> Result<Self, UdsError> {
        let path = path_of(endpoint)?;
        if Path::new(path).exists() {
            // A listener answers a connect; a stale file refuses it.
            match connect(endpoint, path) {
                Ok(_) => {
                    return Err(UdsError::Sys {
                        call: "bind",
                        endpoint: endpoint.to_owned(),
                        source: io::Error::from(io::ErrorKind::AddrInUse),
                    })
                }
                Err(_) => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        let listener = socket(endpoint, true)?;
        let (addr, len) = sockaddr(path);
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        let r = unsafe {
            libc::bind(
                listener.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if r != 0 {
            return Err(sys("bind", endpoint));
        }
        // SAFETY: a bound socket.
        if unsafe { libc::listen(listener.as_raw_fd(), 256) } != 0 {
            return Err(sys("listen", endpoint));
        }
        let me = format!("ipc://{path}");
        let fds = vec![pollfd(listener.as_raw_fd())];
        Ok(Self {
            sender: UdsSender {
                me: me.clone(),
                conns: HashMap::new(),
                timeout: SEND_TIMEOUT,
            },
            receiver: UdsReceiver {
                me,
                path: PathBuf::from(path),
                listener,
                conns: Vec::new(),
                fds,
                next: 0,
                gone: String::new(),
            },
        })
    }

    /// The endpoint it listens on.
    pub fn endpoint(&self) -> &str {
        &self.receiver.me
    }
}

impl ControlChannel for UdsChannel {
    type Sender = UdsSender;
    type Receiver = UdsReceiver;

    fn split(self) -> (UdsSender, UdsReceiver) {
        (self.sender, self.receiver)
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Connects to the listener at `path` (blocking, with a send timeout).
fn connect(endpoint: &str, path: &str) -> Result<OwnedFd, UdsError> {
    let fd = socket(endpoint, false)?;
    let (addr, len) = sockaddr(path);
    // SAFETY: addr is a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if r != 0 {
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
fn send_packet(
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

/// The sending side: one connection per destination, made on first use.
#[derive(Debug)]
pub struct UdsSender {
    me: String,
    conns: HashMap<String, OwnedFd>,
    timeout: Duration,
}

impl UdsSender {
    fn connection(&mut self, to: &str) -> Result<&OwnedFd, UdsError> {
        if !self.conns.contains_key(to) {
            let fd = connect(to, path_of(to)?)?;
            send_packet(&fd, to, self.timeout, HELLO, b"", self.me.as_bytes())?;
            self.conns.insert(to.to_owned(), fd);
        }
        self.conns.get(to).ok_or_else(|| UdsError::BadEndpoint {
            endpoint: to.to_owned(),
            why: "connection lost",
        })
    }
}

impl ControlSend for UdsSender {
    type Error = UdsError;

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), UdsError> {
        let &[magic, payload] = parts else {
            return Err(UdsError::Frames {
                to: to.to_owned(),
                count: parts.len(),
            });
        };
        let timeout = self.timeout;
        let cached = self.conns.contains_key(to);
        let r = send_packet(self.connection(to)?, to, timeout, MESSAGE, magic, payload);
        match r {
            Err(UdsError::PeerGone { .. }) if cached => {
                // The process we were connected to is gone; whoever listens
                // at the endpoint now (a restarted peer) gets a new
                // connection, once.
                self.conns.remove(to);
                let r = send_packet(self.connection(to)?, to, timeout, MESSAGE, magic, payload);
                if r.is_err() {
                    self.conns.remove(to);
                }
                r
            }
            Err(e) => {
                if matches!(e, UdsError::PeerGone { .. }) {
                    self.conns.remove(to);
                }
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }
}

#[derive(Debug)]
struct Inbound {
    fd: OwnedFd,
    /// The peer's endpoint, from its hello (empty until then).
    from: String,
}

/// The receiving side: the listener and the connections peers made.
#[derive(Debug)]
pub struct UdsReceiver {
    me: String,
    path: PathBuf,
    listener: OwnedFd,
    conns: Vec<Inbound>,
    /// `fds[0]` is the listener, `fds[1 + i]` is `conns[i]`.
    fds: Vec<libc::pollfd>,
    /// Where the next scan starts, so that no peer starves the others.
    next: usize,
    /// The endpoint of the last peer reported gone.
    gone: String,
}

/// What one ready connection yielded.
enum Step {
    Nothing,
    Hello,
    Message(usize, usize),
    Closed,
}

impl UdsReceiver {
    fn accept_all(&mut self) -> Result<(), UdsError> {
        loop {
            // SAFETY: accept4 on our listener with no address wanted.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ECONNABORTED | libc::EINTR) => Ok(()),
                    _ => Err(UdsError::Sys {
                        call: "accept4",
                        endpoint: self.me.clone(),
                        source: e,
                    }),
                };
            }
            // SAFETY: fd was just returned by accept4; we own it.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            self.fds.push(pollfd(fd.as_raw_fd()));
            self.conns.push(Inbound {
                fd,
                from: String::new(),
            });
        }
    }

    fn read(&mut self, i: usize, buf: &mut [u8]) -> Result<Step, UdsError> {
        let fd = self.conns[i].fd.as_raw_fd();
        // SAFETY: buf is writable for its length; MSG_TRUNC makes recv
        // return the packet's real length when it is longer.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        let conn = &mut self.conns[i];
        let from = |c: &Inbound| {
            if c.from.is_empty() {
                "(unnamed peer)".to_owned()
            } else {
                c.from.clone()
            }
        };
        if n < 0 {
            return match io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(Step::Nothing),
                Some(libc::ECONNRESET) => Ok(Step::Closed),
                _ => Err(sys("recv", &from(conn))),
            };
        }
        let n = n as usize;
        if n == 0 {
            return Ok(Step::Closed);
        }
        if n > buf.len() {
            return Err(UdsError::TooLarge {
                from: from(conn),
                len: n,
                cap: buf.len(),
            });
        }
        let malformed = |c: &Inbound, why| UdsError::Malformed { from: from(c), why };
        if n < 2 || 2 + buf[1] as usize > n {
            return Err(malformed(conn, "shorter than its header"));
        }
        let start = 2 + buf[1] as usize;
        match buf[0] {
            HELLO if conn.from.is_empty() => {
                let Ok(name) = std::str::from_utf8(&buf[start..n]) else {
                    return Err(malformed(conn, "hello endpoint is not UTF-8"));
                };
                conn.from = name.to_owned();
                Ok(Step::Hello)
            }
            MESSAGE if !conn.from.is_empty() => Ok(Step::Message(start, n)),
            MESSAGE => Err(malformed(conn, "message before hello")),
            _ => Err(malformed(conn, "unknown packet kind")),
        }
    }

    fn remove(&mut self, i: usize) -> String {
        self.fds.remove(1 + i);
        self.conns.remove(i).from
    }
}

impl ControlRecv for UdsReceiver {
    type Error = UdsError;

    fn local_endpoint(&self) -> &str {
        &self.me
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
    ) -> Result<Option<ChannelEvent<'b>>, UdsError> {
        self.receive(buf, wait, None)
    }

    fn can_wake(&self) -> bool {
        true
    }

    fn recv_or_wake<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: RawFd,
    ) -> Result<Option<ChannelEvent<'b>>, UdsError> {
        self.receive(buf, wait, Some(wake))
    }
}

impl UdsReceiver {
    fn receive<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<RawFd>,
    ) -> Result<Option<ChannelEvent<'b>>, UdsError> {
        let deadline = Instant::now() + wait;
        // Indices only inside the loop; the borrowed answer is made after.
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // The wake descriptor goes last for this call only, so that
            // the connections keep their indices.
            if let Some(w) = wake {
                self.fds.push(pollfd(w));
            }
            // SAFETY: fds is a valid array of pollfd of that length.
            let r = unsafe {
                libc::ppoll(
                    self.fds.as_mut_ptr(),
                    self.fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            let err = (r < 0).then(io::Error::last_os_error);
            let woke = wake.is_some() && self.fds.pop().is_some_and(|p| p.revents != 0);
            if let Some(e) = err {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(sys("ppoll", &self.me));
            }
            if r == 0 || (woke && r == 1) {
                break None;
            }
            if self.fds[0].revents != 0 {
                self.accept_all()?;
            }
            let n = self.conns.len();
            let mut found = None;
            for k in 0..n {
                let i = (self.next + k) % n;
                if self.fds[1 + i].revents == 0 {
                    continue;
                }
                match self.read(i, buf)? {
                    Step::Nothing | Step::Hello => continue,
                    step => {
                        found = Some((i, step));
                        break;
                    }
                }
            }
            match found {
                Some((i, Step::Message(start, end))) => {
                    self.next = i + 1;
                    break Some(Some((i, start, end)));
                }
                Some((i, _closed)) => {
                    self.gone = self.remove(i);
                    if !self.gone.is_empty() {
                        break Some(None);
                    }
                }
                None => {}
            }
            if woke || Instant::now() >= deadline {
                break None;
            }
        };
        Ok(match outcome {
            None => None,
            Some(None) => Some(ChannelEvent::Gone { from: &self.gone }),
            Some(Some((i, start, end))) => {
                let magic_len = buf[1] as usize;
                let (head, payload) = buf[..end].split_at(start);
                Some(ChannelEvent::Message(Incoming {
                    from: &self.conns[i].from,
                    via: &self.me,
                    magic: &head[2..2 + magic_len],
                    payload,
                }))
            }
        })
    }
}

impl Drop for UdsReceiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(tag: &str) -> String {
        format!(
            "ipc://{}/ferry-uds-test-{}-{tag}.sock",
            std::env::temp_dir().display(),
            std::process::id()
        )
    }

    fn recv_message(rx: &mut UdsReceiver) -> (String, Vec<u8>, Vec<u8>) {
        let mut buf = vec![0u8; 4096];
        for _ in 0..100 {
            if let Some(ChannelEvent::Message(m)) =
                rx.recv(&mut buf, Duration::from_millis(50)).unwrap()
            {
                return (m.from.to_owned(), m.magic.to_vec(), m.payload.to_vec());
            }
        }
        panic!("no message");
    }

    #[test]
    fn messages_carry_their_sender_and_closing_reports_gone() {
        let (ea, eb) = (endpoint("a"), endpoint("b"));
        let (mut a_tx, a_rx) = UdsChannel::bind(&ea).unwrap().split();
        let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
        a_tx.send(&eb, &[b"__transfer__", b"{\"x\":1}"]).unwrap();
        a_tx.send(&eb, &[b"", b"second"]).unwrap();
        assert_eq!(
            recv_message(&mut b_rx),
            (ea.clone(), b"__transfer__".to_vec(), b"{\"x\":1}".to_vec())
        );
        assert_eq!(
            recv_message(&mut b_rx),
            (ea.clone(), vec![], b"second".to_vec())
        );
        drop(a_tx);
        drop(a_rx);
        let mut buf = vec![0u8; 64];
        let ev = b_rx.recv(&mut buf, Duration::from_secs(2)).unwrap();
        assert_eq!(ev, Some(ChannelEvent::Gone { from: &ea }));
    }

    #[test]
    fn a_dead_endpoint_is_peer_gone_and_oversize_is_dropped() {
        let (ea, eb) = (endpoint("c"), endpoint("d"));
        let (mut a_tx, _a_rx) = UdsChannel::bind(&ea).unwrap().split();
        let e = a_tx.send(&endpoint("nobody"), &[b"", b"x"]);
        assert!(matches!(e, Err(UdsError::PeerGone { .. })), "{e:?}");
        let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
        a_tx.send(&eb, &[b"", &[7u8; 1000]]).unwrap();
        a_tx.send(&eb, &[b"", b"ok"]).unwrap();
        let mut small = vec![0u8; 100];
        let mut saw_too_large = false;
        for _ in 0..10 {
            match b_rx.recv(&mut small, Duration::from_millis(100)) {
                Err(UdsError::TooLarge { len: 1002, .. }) => saw_too_large = true,
                Ok(Some(ChannelEvent::Message(m))) => {
                    assert_eq!(m.payload, b"ok");
                    break;
                }
                other => assert!(matches!(other, Ok(None)), "{other:?}"),
            }
        }
        assert!(saw_too_large);
        assert!(matches!(
            path_of("tcp://1.2.3.4:5"),
            Err(UdsError::BadEndpoint { .. })
        ));
    }

    #[test]
    fn a_readable_wake_descriptor_ends_the_wait_and_messages_still_come() {
        let (ea, eb) = (endpoint("w1"), endpoint("w2"));
        let (mut a_tx, _a_rx) = UdsChannel::bind(&ea).unwrap().split();
        let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
        assert!(b_rx.can_wake());
        let wake = ferry_hostmem::EventFd::new().unwrap();
        let fd = wake.fd();
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        assert!(b_rx
            .recv_or_wake(&mut buf, Duration::from_millis(50), fd)
            .unwrap()
            .is_none());
        assert!(
            t.elapsed() >= Duration::from_millis(45),
            "waited the time out"
        );
        wake.signal();
        let t = Instant::now();
        assert!(b_rx
            .recv_or_wake(&mut buf, Duration::from_secs(10), fd)
            .unwrap()
            .is_none());
        assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
        a_tx.send(&eb, &[b"m", b"p"]).unwrap();
        let mut got = None;
        for _ in 0..100 {
            if let Some(ChannelEvent::Message(m)) = b_rx
                .recv_or_wake(&mut buf, Duration::from_millis(50), fd)
                .unwrap()
            {
                got = Some(m.payload.to_vec());
                break;
            }
        }
        assert_eq!(got.as_deref(), Some(&b"p"[..]));
    }

    #[test]
    fn a_live_endpoint_cannot_be_taken() {
        let e = endpoint("e");
        let _first = UdsChannel::bind(&e).unwrap();
        assert!(UdsChannel::bind(&e).is_err());
    }
}
