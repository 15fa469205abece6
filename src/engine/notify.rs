//! Notifications: short messages between engines, over the engine's own
//! side channel (ZeroMQ).
//!
//! Each engine binds one ROUTER socket (its inbox) and names its endpoint
//! in its session id; it sends to a peer through one DEALER socket per
//! peer endpoint. One connection per sender and peer keeps a sender's
//! notifications in order, and ZeroMQ's queues push back rather than drop:
//! the receiver's queue full, its socket stops reading, the sender's fills,
//! and a send waits (at most [`SEND_WAIT`], then fails) rather than lose a
//! notification while both engines live.
//!
//! Why a side channel and not the data plane's own immediate data (remote
//! CQ data, write-with-immediate): those carry 4 to 8 bytes, where a
//! notification carries up to [`MAX_NOTIFICATION`], and the local plane
//! has no channel at all. A notification attached to a transfer is sent
//! only after the transfer's last completion, which on every engine data
//! plane means its bytes are in the peer's memory; so it never arrives
//! before them.
//!
//! Who may notify is the engine's [`Guard`]: the allow-list on the inbox,
//! and, with CURVE, an inbox that admits only the listed keys (its own
//! public key travels in the session id, `<key>@tcp://host:port` after
//! the `|`, so that senders connect as CURVE clients). With CURVE a
//! notification's sender is the key its connection was admitted with: one
//! whose claimed session id names another key is dropped, so an admitted
//! peer cannot speak under another's name. Without CURVE the claimed name
//! is all there is (the allow-list says only which hosts may connect).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tensorferry_core::transport::FaultKind;
use tensorferry_zmq::{zmq, CurvePublicKey, Guard, ZapHandler, KEY_TEXT_LEN};

use super::EngineError;

/// The longest notification, in bytes.
pub const MAX_NOTIFICATION: usize = 4096;

/// The longest sender name a notification may carry (an engine's session
/// id, which names every region on some data planes: libfabric's, about
/// 100 bytes a region, 64 regions at most).
const MAX_FROM: usize = 16 << 10;

/// How long a send waits for room in the peer's queues.
const SEND_WAIT: Duration = Duration::from_secs(10);

/// How long a closing engine keeps trying to deliver what it sent.
const LINGER: Duration = Duration::from_secs(2);

/// Peer endpoints remembered before the cache is emptied.
const MAX_PEERS: usize = 1024;

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

fn zmq_error(verb: &'static str, endpoint: &str, e: zmq::Error) -> EngineError {
    let kind = match e {
        zmq::Error::EAGAIN => FaultKind::Timeout,
        zmq::Error::EHOSTUNREACH | zmq::Error::ECONNREFUSED => FaultKind::PeerGone,
        zmq::Error::EINVAL | zmq::Error::EPROTONOSUPPORT => FaultKind::UnknownPeer,
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
    // Dropped after the sockets (fields drop in order): terminating a
    // context waits for its sockets, and the handler must answer for them
    // while they live.
    inbox: Mutex<zmq::Socket>,
    outboxes: Mutex<HashMap<String, Arc<Mutex<zmq::Socket>>>>,
    /// Where peers send, as the session id names it (with the inbox's key
    /// under CURVE).
    address: String,
    /// The inbox's endpoint.
    endpoint: String,
    guard: Guard,
    /// Notifications dropped because they named a sender other than the
    /// key they came with.
    forged: AtomicU64,
    _zap: Option<ZapHandler>,
    context: zmq::Context,
}

debug_naming!(Notifier, |n| { "endpoint": n.endpoint });

impl Notifier {
    /// Binds the inbox on `host` (an address of this machine peers reach
    /// it by), on a port the system picks, guarded by `guard`.
    pub fn bind(host: &str, guard: &Guard) -> Result<Self, EngineError> {
        let bind = if host.contains(':') {
            format!("tcp://[{host}]:*")
        } else {
            format!("tcp://{host}:*")
        };
        let context = zmq::Context::new();
        let guarded = |e: tensorferry_zmq::ZmqError| EngineError::Transport {
            verb: "guard the notification inbox",
            message: format!("{bind}: {e}"),
            kind: FaultKind::Io,
        };
        let zap = guard.start(&context).map_err(guarded)?;
        let inbox = context
            .socket(zmq::ROUTER)
            .map_err(|e| zmq_error("open the notification inbox", &bind, e))?;
        // A peer that sends more than a notification is cut off, not
        // buffered.
        let most = (MAX_NOTIFICATION + MAX_FROM + 64) as i64;
        inbox
            .set_maxmsgsize(most)
            .and_then(|()| inbox.set_linger(0))
            .and_then(|()| {
                if host.contains(':') {
                    inbox.set_ipv6(true)
                } else {
                    Ok(())
                }
            })
            .map_err(|e| zmq_error("set the notification inbox's options", &bind, e))?;
        guard.server(&inbox, &bind).map_err(guarded)?;
        inbox
            .bind(&bind)
            .map_err(|e| zmq_error("bind the notification inbox", &bind, e))?;
        let endpoint = inbox
            .get_last_endpoint()
            .map_err(|e| zmq_error("read the notification inbox's endpoint", &bind, e))?
            .map_err(|_| EngineError::Transport {
                verb: "read the notification inbox's endpoint",
                message: format!("{bind}: not UTF-8"),
                kind: FaultKind::Io,
            })?;
        let address = match &guard.curve {
            Some(c) => format!("{}@{endpoint}", c.key.public()),
            None => endpoint.clone(),
        };
        Ok(Self {
            inbox: Mutex::new(inbox),
            outboxes: Mutex::new(HashMap::new()),
            address,
            endpoint,
            guard: guard.clone(),
            forged: AtomicU64::new(0),
            _zap: zap,
            context,
        })
    }

    /// Where peers send this engine's notifications, as its session id
    /// names it: the inbox's endpoint, after its CURVE key under CURVE.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Notifications dropped so far because they named a sender other
    /// than the key they came with.
    pub fn forged(&self) -> u64 {
        self.forged.load(Ordering::Relaxed)
    }

    /// The outbox to the inbox a session id's notification part `to`
    /// names (its endpoint, and its key under CURVE).
    fn outbox(&self, to: &str) -> Result<Arc<Mutex<zmq::Socket>>, EngineError> {
        let mut outboxes = lock(&self.outboxes);
        if let Some(s) = outboxes.get(to) {
            return Ok(Arc::clone(s));
        }
        let (server, endpoint) = inbox_of(to);
        // Under CURVE a notification goes only to an engine this one
        // admits: what it says is for the peers the deployment named.
        if let (Some(curve), Some(key)) = (&self.guard.curve, &server) {
            if !curve.admits(key) {
                return Err(EngineError::Transport {
                    verb: "notify",
                    message: format!(
                        "{endpoint}: its key {} is not among the keys this engine admits (curve_peers)",
                        key.to_z85()
                    ),
                    kind: FaultKind::UnknownPeer,
                });
            }
        }
        if !endpoint.starts_with("tcp://") {
            return Err(EngineError::Transport {
                verb: "notify",
                message: format!("{to:?} is not a notification endpoint (tcp://host:port)"),
                kind: FaultKind::UnknownPeer,
            });
        }
        let s = self
            .context
            .socket(zmq::DEALER)
            .map_err(|e| zmq_error("open a notification outbox", endpoint, e))?;
        s.set_sndtimeo(SEND_WAIT.as_millis() as i32)
            .and_then(|()| s.set_linger(LINGER.as_millis() as i32))
            .and_then(|()| s.set_ipv6(endpoint.contains('[')))
            .map_err(|e| zmq_error("set a notification outbox's options", endpoint, e))?;
        self.guard
            .client(&s, endpoint, server.as_ref())
            .map_err(|e| EngineError::Transport {
                verb: "notify",
                message: format!("{endpoint}: {e}"),
                kind: FaultKind::UnknownPeer,
            })?;
        s.connect(endpoint)
            .map_err(|e| zmq_error("connect a notification outbox", endpoint, e))?;
        if outboxes.len() >= MAX_PEERS {
            outboxes.clear();
        }
        let s = Arc::new(Mutex::new(s));
        outboxes.insert(to.to_owned(), Arc::clone(&s));
        Ok(s)
    }

    /// Sends `message` from `from` (this engine's session id) to the inbox
    /// at `to`; waits at most [`SEND_WAIT`] for room in the queues.
    pub fn send(&self, from: &str, to: &str, message: &[u8]) -> Result<(), EngineError> {
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
        let outbox = self.outbox(to)?;
        let outbox = lock(&outbox);
        outbox
            .send_multipart([from.as_bytes(), message], 0)
            .map_err(|e| match e {
                zmq::Error::EAGAIN => EngineError::Transport {
                    verb: "notify",
                    message: format!(
                        "{to}: the peer took no notification for {SEND_WAIT:?} (it reads none, or is gone)"
                    ),
                    kind: FaultKind::Timeout,
                },
                e => zmq_error("notify", to, e),
            })
    }

    /// Every notification that has arrived, in order per sender, without
    /// waiting. Malformed ones (not sent by a ferry engine) are dropped
    /// and logged, and so, under CURVE, are those whose claimed sender is
    /// not the key they came with.
    pub fn take(&self, into: &mut Vec<Notification>) -> Result<(), EngineError> {
        let inbox = lock(&self.inbox);
        let mut first = zmq::Message::new();
        loop {
            // [routing id, from, message]; the first frame carries the
            // connection's properties.
            match inbox.recv(&mut first, zmq::DONTWAIT) {
                Ok(()) => {}
                Err(zmq::Error::EAGAIN) => return Ok(()),
                Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_error("read notifications", &self.endpoint, e)),
            }
            let user = first.gets("User-Id").unwrap_or("").to_owned();
            // The rest of the message: two frames are kept (a third makes
            // it malformed), any more drained unread.
            let mut rest = Vec::with_capacity(3);
            let mut more = first.get_more();
            while more {
                let Ok(part) = inbox.recv_bytes(0) else {
                    break;
                };
                if rest.len() < 3 {
                    rest.push(part);
                }
                more = inbox.get_rcvmore().unwrap_or(false);
            }
            let mut parts = rest.into_iter();
            let (Some(from), Some(message), None) = (parts.next(), parts.next(), parts.next())
            else {
                tracing::warn!(inbox = %self.endpoint, "dropped a notification of the wrong shape");
                continue;
            };
            let from = match String::from_utf8(from) {
                Ok(f) if f.len() <= MAX_FROM && message.len() <= MAX_NOTIFICATION => f,
                _ => {
                    tracing::warn!(inbox = %self.endpoint, "dropped a notification with a bad sender or size");
                    continue;
                }
            };
            if self.guard.curve.is_some() && !spoken_by(&from, &user) {
                let n = self.forged.fetch_add(1, Ordering::Relaxed) + 1;
                if n <= 10 || n % 1000 == 0 {
                    tracing::warn!(inbox = %self.endpoint, claimed = %from, key = %user, dropped = n, "dropped a notification whose sender is not the key it came with");
                }
                continue;
            }
            into.push(Notification { from, message });
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
