//! The engine's inbox: a listening socket and a connection per sending
//! engine, read by the thread that asks for notifications (no thread
//! between). One readiness poll that does not wait finds the connections
//! with bytes; each is read until it has none, and cut into frames.
//!
//! Two polls: the lobby (the listeners, and connections whose CURVE
//! handshake has not arrived) and the open connections. The engine's
//! driver thread serves the lobby too, at each tick, so that a sender's
//! connection and handshake are answered while nobody reads; only a
//! reader of notifications touches the open connections (their readiness
//! is edge-triggered: a poll that did not read them would lose it).
//!
//! The guard is applied per connection: the allow-list when it is
//! accepted, and under CURVE the sender's key when its handshake arrives
//! (see `seal`). A connection that breaks the stream's rules (a frame too
//! long, of an unknown kind, a notification before a name) is closed: its
//! sender is not a ferry engine.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixListener};
use mio::{Events, Interest, Poll, Token};
use tensorferry_zmq::{CurvePublicKey, Guard};

use super::frame::{self, NAME, NOTE};
use super::seal::Seal;
use super::socket::Accepted;
use super::{spoken_by, Notification, MAX_FROM, MAX_NOTIFICATION};

/// The listeners' tokens; connections count from 2.
const LISTENER: Token = Token(0);
const LOCAL_LISTENER: Token = Token(1);

/// The most connections an inbox keeps (one per sending engine), at
/// most: a quarter of the descriptors the process may open, so that a
/// flood of strangers cannot take the data plane's; past it, new ones are
/// closed at once.
const MAX_CONNECTIONS: usize = 4096;

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 << 10;

/// Bytes one `take` reads from one connection before it turns to the
/// others (the connection stays ready for the next): a sender that never
/// stops cannot hold the inbox.
const READ_BUDGET: usize = 4 * READ_CHUNK;

/// How long a connection may wait in the lobby for its handshake.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

/// What every connection's handling needs of the inbox.
struct Rules<'a> {
    guard: &'a Guard,
    /// The guard's domain for this inbox (`None`: nothing enforced).
    domain: Option<&'static str>,
    endpoint: &'a str,
    forged: &'a AtomicU64,
}

impl<'a> Rules<'a> {
    fn new(guard: &'a Guard, endpoint: &'a str, forged: &'a AtomicU64) -> Self {
        Self {
            guard,
            domain: guard.domain(endpoint),
            endpoint,
            forged,
        }
    }
}

/// A sending engine's connection.
struct Connection {
    stream: Accepted,
    /// Its address, for the allow-list: a Unix socket's is the one of
    /// loopback's and the inbox's own that the list admits.
    address: IpAddr,
    /// Its keys once the handshake is done (under CURVE).
    seal: Option<Seal>,
    sender: Sender,
    /// The start of a frame still arriving.
    partial: Vec<u8>,
    /// An opened body.
    body: Vec<u8>,
    /// True while it waits in the lobby for its handshake.
    in_lobby: bool,
}

/// Who a connection says it is.
#[derive(Default)]
struct Sender {
    /// The key it was admitted with, in Z85 (under CURVE).
    key: Option<String>,
    /// The session id it last sent.
    name: Option<String>,
    /// True while its name is not the key it was admitted with.
    forged: bool,
}

/// The inbox's socket and its connections.
pub(super) struct Inbox {
    lobby: Poll,
    open: Poll,
    /// Lobby connections by when their handshake is due, oldest first.
    due: VecDeque<(Instant, Token)>,
    most: usize,
    /// The address the TCP listener is bound to.
    bound: IpAddr,
    events: Events,
    ready: Vec<Token>,
    listener: TcpListener,
    local: Option<UnixListener>,
    connections: HashMap<Token, Connection>,
    next: usize,
    scratch: Box<[u8]>,
}

impl Inbox {
    /// An inbox on `listener` and `local` (its Unix name, if it has one),
    /// bound and listening.
    pub(super) fn new(
        listener: std::net::TcpListener,
        local: Option<std::os::unix::net::UnixListener>,
    ) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let bound = listener.local_addr()?.ip().to_canonical();
        let mut listener = TcpListener::from_std(listener);
        let lobby = Poll::new()?;
        lobby
            .registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let local = match local {
            Some(l) => {
                l.set_nonblocking(true)?;
                let mut l = UnixListener::from_std(l);
                lobby
                    .registry()
                    .register(&mut l, LOCAL_LISTENER, Interest::READABLE)?;
                Some(l)
            }
            None => None,
        };
        Ok(Self {
            lobby,
            open: Poll::new()?,
            due: VecDeque::new(),
            most: most_connections(),
            bound,
            events: Events::with_capacity(256),
            ready: Vec::new(),
            listener,
            local,
            connections: HashMap::new(),
            next: 2,
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
        })
    }

    /// The open connections' poll, as a descriptor: readable while one
    /// of them has bytes no `take` read yet.
    pub(super) fn ready_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.open.as_raw_fd()
    }

    /// Accepts new connections and answers handshakes, without waiting.
    pub(super) fn serve(
        &mut self,
        guard: &Guard,
        endpoint: &str,
        forged: &AtomicU64,
    ) -> std::io::Result<()> {
        let rules = Rules::new(guard, endpoint, forged);
        let mut none = Vec::new();
        self.close_overdue(&rules);
        self.ready(true)?;
        // Every ready connection is read even if accepting failed: its
        // readiness was reported once, and would not be again.
        let mut failed = None;
        for at in 0..self.ready.len() {
            match self.ready[at] {
                t @ (LISTENER | LOCAL_LISTENER) => {
                    if let Err(e) = self.accept(t == LOCAL_LISTENER, &rules) {
                        failed.get_or_insert(e);
                    }
                }
                t => self.read(t, &rules, &mut none),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Every notification that has arrived, without waiting.
    pub(super) fn take(
        &mut self,
        guard: &Guard,
        endpoint: &str,
        forged: &AtomicU64,
        into: &mut Vec<Notification>,
    ) -> std::io::Result<()> {
        // The lobby's troubles are its own: what arrived is read anyway.
        if let Err(e) = self.serve(guard, endpoint, forged) {
            tracing::warn!(inbox = endpoint, error = %e, "cannot accept notification connections");
        }
        let rules = Rules::new(guard, endpoint, forged);
        self.ready(false)?;
        for at in 0..self.ready.len() {
            self.read(self.ready[at], &rules, into);
        }
        Ok(())
    }

    /// Fills `ready` with what the lobby's poll, or the open one's, finds
    /// ready now.
    fn ready(&mut self, lobby: bool) -> std::io::Result<()> {
        let poll = if lobby {
            &mut self.lobby
        } else {
            &mut self.open
        };
        loop {
            match poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.ready.clear();
        self.ready
            .extend(self.events.iter().map(mio::event::Event::token));
        Ok(())
    }

    fn accept(&mut self, local: bool, rules: &Rules<'_>) -> std::io::Result<()> {
        loop {
            let accepted = match (&self.local, local) {
                (Some(l), true) => l.accept().map(|(s, _)| (Accepted::Unix(s), None)),
                (None, true) => return Ok(()),
                (_, false) => self
                    .listener
                    .accept()
                    .map(|(s, peer)| (Accepted::Tcp(s), Some(peer.ip().to_canonical()))),
            };
            let (mut stream, address) = match accepted {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // The connection went before it was taken; others may wait.
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // Out of descriptors, say: those still queued wait for
                    // the next turn, the listener armed again for them.
                    let (token, source): (Token, &mut dyn mio::event::Source) =
                        match (local, &mut self.local) {
                            (true, Some(l)) => (LOCAL_LISTENER, l),
                            _ => (LISTENER, &mut self.listener),
                        };
                    self.lobby
                        .registry()
                        .reregister(source, token, Interest::READABLE)?;
                    return Err(e);
                }
            };
            // A Unix socket's peer is of this host: it may connect to the
            // TCP inbox from loopback or from the inbox's own address.
            let candidates = match address {
                Some(a) => [Some(a), None],
                None => [Some(IpAddr::from([127, 0, 0, 1])), Some(self.bound)],
            };
            let Some(address) = candidates
                .into_iter()
                .flatten()
                .find(|a| on_allow_list(&rules.guard.allow, *a))
            else {
                tracing::warn!(inbox = rules.endpoint, peer = ?address, "refused a notification connection: its address is not on the allow-list");
                continue;
            };
            if self.connections.len() >= self.most {
                tracing::warn!(inbox = rules.endpoint, peer = %address, "refused a notification connection: {} are open", self.most);
                continue;
            }
            let token = Token(self.next);
            self.next += 1;
            // Under CURVE it waits in the lobby for its handshake.
            let in_lobby = rules.guard.curve.is_some();
            if in_lobby {
                self.due.push_back((Instant::now() + HANDSHAKE_WAIT, token));
            }
            let poll = if in_lobby { &self.lobby } else { &self.open };
            poll.registry()
                .register(stream.source(), token, Interest::READABLE)?;
            self.connections.insert(
                token,
                Connection {
                    stream,
                    address,
                    seal: None,
                    sender: Sender::default(),
                    partial: Vec::new(),
                    body: Vec::new(),
                    in_lobby,
                },
            );
        }
    }

    /// Reads `token`'s connection until it has no bytes; closes it when
    /// it ends or breaks the rules.
    fn read(&mut self, token: Token, rules: &Rules<'_>, into: &mut Vec<Notification>) {
        let Some(c) = self.connections.get_mut(&token) else {
            return;
        };
        let mut budget = READ_BUDGET;
        let ended = loop {
            if budget == 0 {
                // Its turn is over; armed again, it is ready at the next.
                let poll = if c.in_lobby { &self.lobby } else { &self.open };
                match poll
                    .registry()
                    .reregister(c.stream.source(), token, Interest::READABLE)
                {
                    Ok(()) => return,
                    Err(e) => break Some(format!("arm it again: {e}")),
                }
            }
            let n = match c.stream.read(&mut self.scratch) {
                Ok(0) => break None,
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    n
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => break Some(e.to_string()),
            };
            let got = &self.scratch[..n];
            let used = if c.partial.is_empty() {
                c.consume(got, rules, into).map(|used| {
                    c.partial.extend_from_slice(&got[used..]);
                })
            } else {
                c.partial.extend_from_slice(got);
                let partial = std::mem::take(&mut c.partial);
                let used = c.consume(&partial, rules, into);
                c.partial = partial;
                used.map(|used| {
                    c.partial.drain(..used);
                })
            };
            if let Err(why) = used {
                break Some(why);
            }
            if c.in_lobby && c.seal.is_some() {
                // Nothing may follow a handshake before its answer.
                if !c.partial.is_empty() {
                    break Some("bytes before the handshake's answer".into());
                }
                c.in_lobby = false;
                let moved = self
                    .lobby
                    .registry()
                    .deregister(c.stream.source())
                    .and_then(|()| {
                        self.open
                            .registry()
                            .register(c.stream.source(), token, Interest::READABLE)
                    });
                if let Err(e) = moved {
                    break Some(format!("move to the open connections: {e}"));
                }
                return;
            }
            // A short read emptied the socket: its next bytes raise a new
            // readiness edge, so asking again would only cost a call.
            if n < self.scratch.len() {
                return;
            }
        };
        if let Some(mut c) = self.connections.remove(&token) {
            if let Some(why) = ended {
                tracing::warn!(inbox = rules.endpoint, peer = %c.address, why, "closed a notification connection");
            }
            // Closing drops it from the poll too; this says so at once.
            let poll = if c.in_lobby { &self.lobby } else { &self.open };
            let _ = poll.registry().deregister(c.stream.source());
        }
    }
}

impl Inbox {
    /// Closes the lobby's connections whose handshake is overdue.
    fn close_overdue(&mut self, rules: &Rules<'_>) {
        let now = Instant::now();
        while let Some(&(due, token)) = self.due.front() {
            if due > now {
                return;
            }
            self.due.pop_front();
            if !self.connections.get(&token).is_some_and(|c| c.in_lobby) {
                continue;
            }
            if let Some(mut c) = self.connections.remove(&token) {
                tracing::warn!(inbox = rules.endpoint, peer = %c.address, "closed a notification connection: no handshake within {HANDSHAKE_WAIT:?}");
                let _ = self.lobby.registry().deregister(c.stream.source());
            }
        }
    }
}

/// True if the allow-list `allow` admits `address` (an empty one admits
/// every address), as the guard's verdict reads it.
fn on_allow_list(allow: &[IpAddr], address: IpAddr) -> bool {
    allow.is_empty() || allow.iter().any(|a| a.to_canonical() == address)
}

/// [`MAX_CONNECTIONS`], or a quarter of the descriptors this process may
/// open if that is fewer.
fn most_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one struct it is given.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let quarter = if known {
        usize::try_from(limit.rlim_cur / 4).unwrap_or(usize::MAX)
    } else {
        MAX_CONNECTIONS
    };
    quarter.clamp(16, MAX_CONNECTIONS)
}

impl Connection {
    /// Handles the whole frames at the front of `bytes`; returns the bytes
    /// they took, or why the connection must close.
    fn consume(
        &mut self,
        bytes: &[u8],
        rules: &Rules<'_>,
        into: &mut Vec<Notification>,
    ) -> Result<usize, String> {
        let mut used = 0;
        while let Some((body, n)) =
            frame::split(&bytes[used..]).map_err(|t| format!("a frame of {} bytes", t.0))?
        {
            used += n;
            self.frame(body, rules, into)?;
            if self.in_lobby && self.seal.is_some() {
                // The handshake: what follows waits for the open poll.
                break;
            }
        }
        Ok(used)
    }

    fn frame(
        &mut self,
        body: &[u8],
        rules: &Rules<'_>,
        into: &mut Vec<Notification>,
    ) -> Result<(), String> {
        match (&rules.guard.curve, &mut self.seal) {
            (None, _) => self.sender.frame(body, rules, into),
            (Some(curve), None) => self.handshake(curve, body, rules),
            (Some(_), Some(seal)) => {
                seal.open_body(body, &mut self.body)?;
                self.sender.frame(&self.body, rules, into)
            }
        }
    }

    /// Answers the sender's handshake, if the guard admits its key and
    /// address.
    fn handshake(
        &mut self,
        curve: &tensorferry_zmq::CurveConfig,
        hello: &[u8],
        rules: &Rules<'_>,
    ) -> Result<(), String> {
        let address = self.address.to_string();
        let (key, seal, answer) = Seal::accept(&curve.key, hello, |key| {
            let domain = rules.domain.unwrap_or_default();
            rules
                .guard
                .admits(domain, &address, b"CURVE", key)
                .map(drop)
                .map_err(|why| format!("refused key {}: {why}", CurvePublicKey(*key).to_z85()))
        })?;
        // The answer is tens of bytes on a fresh connection: the socket
        // takes it whole, or the connection is of no use.
        match self.stream.write(&answer) {
            Ok(n) if n == answer.len() => {}
            Ok(_) => return Err("the handshake's answer did not fit".into()),
            Err(e) => return Err(format!("answer the handshake: {e}")),
        }
        self.sender.key = Some(CurvePublicKey(key).to_z85());
        self.seal = Some(seal);
        Ok(())
    }
}

impl Sender {
    /// Handles an open frame's body.
    fn frame(
        &mut self,
        body: &[u8],
        rules: &Rules<'_>,
        into: &mut Vec<Notification>,
    ) -> Result<(), String> {
        let Some((&kind, payload)) = body.split_first() else {
            return Err("an empty frame".into());
        };
        match kind {
            NAME => {
                let name = std::str::from_utf8(payload)
                    .ok()
                    .filter(|n| n.len() <= MAX_FROM)
                    .ok_or("a sender name that is not a session id")?;
                if let Some(key) = &self.key {
                    self.forged = !spoken_by(name, key);
                }
                match &mut self.name {
                    Some(n) => name.clone_into(n),
                    None => self.name = Some(name.to_owned()),
                }
                Ok(())
            }
            NOTE => {
                if payload.len() > MAX_NOTIFICATION {
                    return Err(format!("a notification of {} bytes", payload.len()));
                }
                let name = self
                    .name
                    .as_ref()
                    .ok_or("a notification before its sender's name")?;
                if self.forged {
                    let n = rules.forged.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 || n % 1000 == 0 {
                        tracing::warn!(inbox = rules.endpoint, claimed = %name, key = ?self.key, dropped = n, "dropped a notification whose sender is not the key it came with");
                    }
                    return Ok(());
                }
                into.push(Notification {
                    from: name.clone(),
                    message: payload.to_vec(),
                });
                Ok(())
            }
            k => Err(format!("a frame of kind {k}")),
        }
    }
}
