//! Notifications: short messages between engines, on a path of their own.
//!
//! Each engine listens on one TCP socket (its inbox) and names its
//! endpoint in its session id; it sends to a peer through one connection
//! per peer inbox (its outbox there), written from the thread that sends
//! and read by the thread that asks for notifications: no thread stands
//! between, so a notification costs a `send` and a `recv` and nothing
//! waits on a scheduler. One connection per sender and peer keeps a
//! sender's notifications in order; what a slow peer's socket does not
//! take waits in its outbox (at most [`NOTIFY_BACKLOG`] bytes) and goes on
//! the next send or the engine's next tick, so nothing is dropped while
//! both engines live.
//!
//! A peer that reads nothing fails only the sends to it: once its outbox
//! is full (the backlog, with the two sockets' buffers: about 1 MiB of
//! notifications), [`notify`](crate::engine::TransferEngine::notify) waits
//! for room at most [`NOTIFY_WAIT`] and then fails (a timeout), and a
//! notification attached to a transfer fails that transfer at once: the
//! thread that sends it also drives the engine's other transfers.
//!
//! Why a side channel and not the data plane's own immediate data (remote
//! CQ data, write-with-immediate): those carry 4 to 8 bytes, where a
//! notification carries up to [`MAX_NOTIFICATION`], and the local plane
//! has no channel at all. A notification attached to a transfer is sent
//! only after the transfer's last completion, which on every engine data
//! plane means its bytes are in the peer's memory; so it never arrives
//! before them.
//!
//! Who may notify is the engine's [`Guard`]: the allow-list is checked as
//! each connection is accepted, and with CURVE every connection runs a
//! handshake with the engines' CURVE keys and is sealed (module `seal`),
//! the inbox admitting only the listed keys (its own public key travels in
//! the session id, `<key>@tcp://host:port` after the `|`). With CURVE a
//! notification's sender is the key its connection was admitted with: one
//! whose claimed session id names another key is dropped, so an admitted
//! peer cannot speak under another's name. Without CURVE the claimed name
//! is all there is (the allow-list says only which hosts may connect).
//!
//! Modules: the stream's frames (`frame`), the sealing under CURVE
//! (`seal`), the sockets, Unix ones between engines of one host
//! (`socket`), the inbox's connections (`inbox`), one peer's outbox
//! (`outbox`).

mod frame;
mod inbox;
mod outbox;
mod seal;
mod socket;

use std::collections::HashMap;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tensorferry_core::transport::FaultKind;
use tensorferry_zmq::{CurvePublicKey, Guard, KEY_TEXT_LEN};

use super::EngineError;
use inbox::Inbox;
use outbox::{Outbox, Refused};

/// The longest notification, in bytes.
pub const MAX_NOTIFICATION: usize = 4096;

/// The longest sender name a notification may carry (an engine's session
/// id, which names every region on some data planes: libfabric's, about
/// 100 bytes a region, 64 regions at most).
const MAX_FROM: usize = 16 << 10;

/// The most bytes of notifications one peer's outbox holds that its
/// socket did not take yet. With the two sockets' buffers, it bounds what
/// a peer that reads nothing holds of this engine's memory.
pub const NOTIFY_BACKLOG: usize = 64 << 10;

/// How long [`notify`](crate::engine::TransferEngine::notify) waits for
/// room in a peer's full outbox before it fails.
pub const NOTIFY_WAIT: Duration = Duration::from_secs(10);

/// How long a closing engine keeps trying to deliver what it sent.
const LINGER: Duration = Duration::from_secs(2);

/// How often the engine's tick looks for outboxes to engines gone.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Each notification socket's kernel buffer, in bytes (Linux doubles it).
const BUFFER: usize = 256 << 10;

/// A notification received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The sending engine's session id.
    pub from: String,
    /// What it sent.
    pub message: Vec<u8>,
}

fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets a socket's kernel buffer (`SO_SNDBUF`, `SO_RCVBUF`) to `bytes`.
fn set_buffer(socket: &impl AsRawFd, option: libc::c_int, bytes: usize) -> std::io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: an int option on a socket the caller owns, the value's size
    // given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn io_error(verb: &'static str, endpoint: &str, e: &std::io::Error) -> EngineError {
    let kind = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => FaultKind::Timeout,
        std::io::ErrorKind::ConnectionRefused
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::WriteZero => FaultKind::PeerGone,
        _ => FaultKind::Io,
    };
    EngineError::Transport {
        verb,
        message: format!("{endpoint}: {e}"),
        kind,
    }
}

/// The notification part of a session id: its endpoint, and the inbox's
/// CURVE key where it has one (`<key>@tcp://...`).
pub(crate) fn inbox_of(part: &str) -> (Option<CurvePublicKey>, &str) {
    let key = part
        .get(..KEY_TEXT_LEN)
        .filter(|_| part.as_bytes().get(KEY_TEXT_LEN) == Some(&b'@'))
        .and_then(|k| CurvePublicKey::from_z85(k).ok());
    match key {
        Some(k) => (Some(k), &part[KEY_TEXT_LEN + 1..]),
        None => (None, part),
    }
}

/// An engine's inbox and outboxes.
pub(crate) struct Notifier {
    inbox: Mutex<Inbox>,
    /// The inbox's open connections' poll (see [`ready_fd`](Self::ready_fd)).
    ready_fd: std::os::fd::RawFd,
    /// One per peer inbox, by the session id's notification part; kept
    /// while its peer lives (a connection closed and opened again could
    /// let a later notification pass an earlier one), forgotten when its
    /// connection fails or its peer closed it with nothing left to send.
    outboxes: Mutex<HashMap<String, Arc<Outbox>>>,
    /// Outboxes with bytes their sockets did not take yet, for the
    /// engine's tick.
    backlog: Mutex<Vec<Arc<Outbox>>>,
    backlogged: AtomicBool,
    /// When the outboxes of engines gone were last dropped.
    swept: Mutex<Instant>,
    /// Where peers send, as the session id names it (with the inbox's key
    /// under CURVE).
    address: String,
    /// The inbox's endpoint.
    endpoint: String,
    guard: Guard,
    /// Notifications dropped because they named a sender other than the
    /// key they came with.
    forged: AtomicU64,
}

debug_naming!(Notifier, |n| { "endpoint": n.endpoint });

impl Notifier {
    /// Binds the inbox on `host` (an address of this machine peers reach
    /// it by), on a port the system picks, guarded by `guard`.
    pub fn bind(host: &str, guard: &Guard) -> Result<Self, EngineError> {
        let bind = if host.contains(':') {
            format!("[{host}]:0")
        } else {
            format!("{host}:0")
        };
        let failed = |verb, e: std::io::Error| io_error(verb, &bind, &e);
        let listener =
            TcpListener::bind(&bind).map_err(|e| failed("bind the notification inbox", e))?;
        // Accepted connections take the listener's buffer.
        set_buffer(&listener, libc::SO_RCVBUF, BUFFER)
            .map_err(|e| failed("set the notification inbox's buffer", e))?;
        let local = listener
            .local_addr()
            .map_err(|e| failed("read the notification inbox's endpoint", e))?;
        let endpoint = format!("tcp://{local}");
        // Without its Unix name (taken by another process of the host,
        // say) the inbox serves by TCP alone.
        let unix = match socket::local_name(&local.to_string())
            .and_then(|name| UnixListener::bind_addr(&name))
        {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(inbox = %local, error = %e, "the notification inbox has no Unix socket; engines of this host reach it by TCP");
                None
            }
        };
        let inbox =
            Inbox::new(listener, unix).map_err(|e| failed("open the notification inbox", e))?;
        let address = match &guard.curve {
            Some(c) => format!("{}@{endpoint}", c.key.public()),
            None => endpoint.clone(),
        };
        Ok(Self {
            ready_fd: inbox.ready_fd(),
            inbox: Mutex::new(inbox),
            outboxes: Mutex::new(HashMap::new()),
            backlog: Mutex::new(Vec::new()),
            backlogged: AtomicBool::new(false),
            swept: Mutex::new(Instant::now()),
            address,
            endpoint,
            guard: guard.clone(),
            forged: AtomicU64::new(0),
        })
    }

    /// Where peers send this engine's notifications, as its session id
    /// names it: the inbox's endpoint, after its CURVE key under CURVE.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// A descriptor that polls readable while a notification may wait
    /// for [`take`](Self::take): the poll of the inbox's open connections
    /// (an epoll descriptor, which reads as readable while its ready list
    /// is not empty). Owned by the inbox, alive as long as this.
    pub fn ready_fd(&self) -> std::os::fd::RawFd {
        self.ready_fd
    }

    /// Notifications dropped so far because they named a sender other
    /// than the key they came with.
    pub fn forged(&self) -> u64 {
        self.forged.load(Ordering::Relaxed)
    }

    /// Connects the outbox to `to` now if there is none (see
    /// [`outbox`](Self::outbox)), so that a later send does not wait for it.
    pub fn reach(&self, to: &str) -> Result<(), EngineError> {
        self.outbox(to).map(drop)
    }

    /// The outbox to the inbox a session id's notification part `to`
    /// names (its endpoint, and its key under CURVE), connected first if
    /// this engine has none yet.
    fn outbox(&self, to: &str) -> Result<Arc<Outbox>, EngineError> {
        if let Some(o) = lock(&self.outboxes).get(to) {
            return Ok(Arc::clone(o));
        }
        let refused = |message: String| EngineError::Transport {
            verb: "notify",
            message,
            kind: FaultKind::UnknownPeer,
        };
        let (server, endpoint) = inbox_of(to);
        let Some(host_port) = endpoint.strip_prefix("tcp://") else {
            return Err(refused(format!(
                "{to:?} is not a notification endpoint (tcp://host:port)"
            )));
        };
        let keys = match (&self.guard.curve, &server) {
            // Under CURVE a notification goes only to an engine this one
            // admits: what it says is for the peers the deployment named.
            (Some(curve), Some(key)) if !curve.admits(key) => {
                return Err(refused(format!(
                    "{endpoint}: its key {} is not among the keys this engine admits (curve_peers)",
                    key.to_z85()
                )))
            }
            (Some(curve), Some(key)) => Some((&curve.key, key)),
            (None, Some(_)) => {
                return Err(refused(format!(
                    "{endpoint}: its inbox takes CURVE connections, and this engine has no CURVE key (curve_key)"
                )))
            }
            (_, None) => None,
        };
        // Connected without the map's lock: sends to other peers go on.
        let opened = Arc::new(Outbox::open(host_port, keys)?);
        let mut outboxes = lock(&self.outboxes);
        // Another thread may have connected meanwhile: one outbox per
        // peer keeps the order, so the first stays and this one closes
        // unused.
        Ok(Arc::clone(outboxes.entry(to.to_owned()).or_insert(opened)))
    }

    /// Sends `message` from `from` (this engine's session id) to the inbox
    /// at `to`. Waits for room in a full outbox until `until`; without
    /// it, a full outbox fails the send at once, and so does a peer with
    /// no outbox (a transfer's notification: its outbox was connected
    /// when the transfer was posted, and is gone only if its connection
    /// failed since).
    pub fn send(
        &self,
        from: &str,
        to: &str,
        message: &[u8],
        until: Option<Instant>,
    ) -> Result<(), EngineError> {
        check_len(message.len())?;
        if from.len() > MAX_FROM {
            return Err(EngineError::Transport {
                verb: "notify",
                message: format!(
                    "this engine's session id is {} bytes, longer than a notification's sender may be ({MAX_FROM})",
                    from.len()
                ),
                kind: FaultKind::TooLarge,
            });
        }
        let outbox = match until {
            Some(_) => self.outbox(to)?,
            None => {
                lock(&self.outboxes)
                    .get(to)
                    .cloned()
                    .ok_or_else(|| EngineError::Transport {
                        verb: "notify",
                        message: format!(
                            "{to}: its connection failed since the transfer was posted"
                        ),
                        kind: FaultKind::PeerGone,
                    })?
            }
        };
        match outbox.send(from, message, until) {
            Ok(false) => Ok(()),
            Ok(true) => {
                if !outbox.listed.swap(true, Ordering::SeqCst) {
                    lock(&self.backlog).push(outbox);
                    self.backlogged.store(true, Ordering::Release);
                }
                Ok(())
            }
            Err(Refused::Full) => Err(EngineError::Transport {
                verb: "notify",
                message: format!(
                    "{to}: the peer left {NOTIFY_BACKLOG} bytes of notifications unsent and its socket's buffers full (it reads none, or too slowly)"
                ),
                kind: FaultKind::Timeout,
            }),
            Err(Refused::Broken(e)) => {
                self.forget(to, &outbox);
                Err(io_error("notify", to, &e))
            }
            Err(Refused::Seal(m)) => {
                self.forget(to, &outbox);
                Err(EngineError::Transport {
                    verb: "notify",
                    message: format!("{to}: {m}"),
                    kind: FaultKind::Io,
                })
            }
        }
    }

    /// Drops `outbox` from the map if it is still the one for `to`.
    fn forget(&self, to: &str, outbox: &Arc<Outbox>) {
        let mut outboxes = lock(&self.outboxes);
        if outboxes.get(to).is_some_and(|o| Arc::ptr_eq(o, outbox)) {
            outboxes.remove(to);
        }
    }

    /// Writes what the outboxes' sockets take of their backlogs, without
    /// waiting (the engine's tick).
    pub fn flush(&self) {
        if !self.backlogged.load(Ordering::Acquire) {
            return;
        }
        let mut backlog = lock(&self.backlog);
        backlog.retain(|outbox| {
            let left = match outbox.flush() {
                // Another thread is writing to it, the backlog first.
                None => return true,
                Some(Ok(left)) => left,
                Some(Err(e)) => {
                    tracing::warn!(peer = %outbox.endpoint, error = %e, "lost the notifications a peer had not taken: its connection failed");
                    let mut outboxes = lock(&self.outboxes);
                    outboxes.retain(|_, o| !Arc::ptr_eq(o, outbox));
                    false
                }
            };
            if left {
                return true;
            }
            outbox.listed.store(false, Ordering::SeqCst);
            // A send that found it still listed, and so did not list it
            // again, may have left bytes since: looked at after the flag
            // is down (under the outbox's lock, which orders the two), so
            // that either this sees them or that send lists it anew.
            if outbox.flush().is_some_and(|f| matches!(f, Ok(false))) {
                return false;
            }
            outbox.listed.store(true, Ordering::SeqCst);
            true
        });
        self.backlogged
            .store(!backlog.is_empty(), Ordering::Release);
    }

    /// Drops, once a second at most, the outboxes whose peer closed its
    /// end with nothing left to send (the engine's tick): a peer gone for
    /// good costs no descriptor.
    pub fn sweep(&self) {
        {
            let mut swept = lock(&self.swept);
            if swept.elapsed() < SWEEP_EVERY {
                return;
            }
            *swept = Instant::now();
        }
        let all: Vec<(String, Arc<Outbox>)> = lock(&self.outboxes)
            .iter()
            .map(|(to, o)| (to.clone(), Arc::clone(o)))
            .collect();
        for (to, outbox) in all {
            if outbox.gone() {
                self.forget(&to, &outbox);
            }
        }
    }

    /// Accepts connections and answers handshakes (the engine's tick), so
    /// that senders are answered while nobody reads notifications; a
    /// reader at work does it meanwhile.
    pub fn serve(&self) {
        let mut inbox = match self.inbox.try_lock() {
            Ok(inbox) => inbox,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if let Err(e) = inbox.serve(&self.guard, &self.endpoint, &self.forged) {
            tracing::warn!(inbox = %self.endpoint, error = %e, "cannot accept notification connections");
        }
    }

    /// Every notification that has arrived, in order per sender, without
    /// waiting. Connections that break the stream's rules (not a ferry
    /// engine's) are closed and logged; under CURVE, notifications whose
    /// claimed sender is not the key they came with are dropped.
    pub fn take(&self, into: &mut Vec<Notification>) -> Result<(), EngineError> {
        lock(&self.inbox)
            .take(&self.guard, &self.endpoint, &self.forged, into)
            .map_err(|e| io_error("read notifications", &self.endpoint, &e))
    }
}

impl Drop for Notifier {
    /// Delivers what the outboxes still hold, for [`LINGER`] at most.
    fn drop(&mut self) {
        let until = Instant::now() + LINGER;
        for outbox in lock(&self.backlog).drain(..) {
            if !outbox.drain(until) {
                tracing::warn!(peer = %outbox.endpoint, "closed with notifications the peer had not taken");
            }
        }
    }
}

/// True if the session id `from` names, as its inbox's key, the key
/// `user` (in Z85) a connection was admitted with.
fn spoken_by(from: &str, user: &str) -> bool {
    let Some((_, part)) = from.rsplit_once('|') else {
        return false;
    };
    match inbox_of(part) {
        (Some(key), _) => !user.is_empty() && key.to_z85() == user,
        (None, _) => false,
    }
}

/// Refuses a notification longer than [`MAX_NOTIFICATION`].
pub(crate) fn check_len(len: usize) -> Result<(), EngineError> {
    if len > MAX_NOTIFICATION {
        return Err(EngineError::Transport {
            verb: "notify",
            message: format!("a notification of {len} bytes; the most is {MAX_NOTIFICATION}"),
            kind: FaultKind::TooLarge,
        });
    }
    Ok(())
}

/// A host address of this machine that other hosts may reach: the first
/// IPv4 address of an interface that is up and not loopback, else
/// loopback's.
#[cfg_attr(not(any(feature = "fabric", feature = "verbs")), allow(dead_code))]
pub(crate) fn this_host() -> String {
    let mut found = None;
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } == 0 {
        let mut at = list;
        while !at.is_null() && found.is_none() {
            // SAFETY: `at` is a node of the list getifaddrs returned,
            // alive until freeifaddrs.
            let ifa = unsafe { &*at };
            at = ifa.ifa_next;
            let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
            let loopback = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
            if !up || loopback || ifa.ifa_addr.is_null() {
                continue;
            }
            // SAFETY: a non-null ifa_addr points at a sockaddr whose
            // family says its type.
            if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET {
                // SAFETY: an AF_INET sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found = Some(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        // SAFETY: the list getifaddrs returned, freed once.
        unsafe { libc::freeifaddrs(list) };
    }
    found.map_or_else(|| "127.0.0.1".to_owned(), |a| a.to_string())
}
