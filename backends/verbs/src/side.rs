//! The side channel: a thread that answers connection exchanges on a
//! ZeroMQ ROUTER socket and sends this transport's own requests, one
//! DEALER socket per connection being made.
//!
//! Callers wake it through an inproc PUSH/PULL pair when a write creates a
//! connection; otherwise it sleeps in `zmq_poll`.
//!
//! What arrives is bounded before it is read: every socket refuses frames
//! larger than an exchange message ([`MAX_FRAME`], libzmq's MAXMSGSIZE,
//! which drops the connection that sends one rather than buffer it), and
//! the ROUTER queues few requests per connection ([`ROUTER_RCVHWM`]). Each
//! request is answered for the requester its connection proves
//! ([`Requester`]: under CURVE its key, else its address), not for the
//! writer session it names.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tensorferry_zmq::{zmq, CurvePublicKey, Guard, ZapHandler};

use crate::conn::{ConnBook, Requester};
use crate::device::Device;
use crate::error::VerbsError;
use crate::exchange::MAX_MESSAGE;
use crate::session::Session;
use crate::wake::WakeSet;

/// How long the thread sleeps when nothing happens (it also checks the
/// stop flag this often).
const IDLE: Duration = Duration::from_millis(100);

/// The largest frame the side channel's sockets take (their MAXMSGSIZE):
/// an exchange message, and room for CURVE's box around it, which libzmq
/// counts too (its MESSAGE command, nonce, MAC and flags: 33 bytes).
/// libzmq drops the connection of a peer that sends a larger one instead
/// of receiving it; the exchange still checks [`MAX_MESSAGE`] itself.
pub(crate) const MAX_FRAME: i64 = MAX_MESSAGE as i64 + 64;

/// Requests the ROUTER queues per connection (its RCVHWM): past it libzmq
/// stops reading that connection until the thread catches up, so one
/// connection holds at most this many frames of [`MAX_FRAME`] (about a
/// MiB) in memory. A writer sends one request per connection.
pub(crate) const ROUTER_RCVHWM: i32 = 64;

pub(crate) fn lock<D: Device>(book: &Mutex<ConnBook<D>>) -> MutexGuard<'_, ConnBook<D>> {
    // A panic elsewhere poisons the lock; the book stays consistent
    // between calls, so it is used as is.
    book.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A side-channel (ZeroMQ) failure, with the peer if there is one.
pub(crate) fn side_err(what: &'static str, peer: Option<&str>, source: zmq::Error) -> VerbsError {
    VerbsError::SideChannel {
        what,
        peer: peer.map(str::to_owned),
        source,
    }
}

/// Endpoints whose side channel keys are remembered at most; past it the
/// oldest are forgotten (a peer whose key is forgotten is noted again by
/// its next connection's first write).
const MAX_KEYS: usize = 4096;

/// The side channel key of each peer endpoint this transport connects to,
/// as the session ids it writes to name them: noted when a write makes a
/// connection, read when the thread connects.
#[derive(Debug, Default)]
pub struct ServerKeys(Mutex<HashMap<String, Option<CurvePublicKey>>>);

impl ServerKeys {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Option<CurvePublicKey>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes the key `session` names for its endpoint (a session that does
    /// not parse makes no connection, and is not noted).
    pub fn note(&self, session: &str) {
        if let Ok(s) = Session::parse(session) {
            let mut map = self.map();
            if map.len() >= MAX_KEYS && !map.contains_key(&s.endpoint) {
                map.clear();
            }
            map.insert(s.endpoint, s.key);
        }
    }

    /// The key of the side channel at `endpoint`, if it has one.
    pub fn of(&self, endpoint: &str) -> Option<CurvePublicKey> {
        self.map().get(endpoint).copied().flatten()
    }
}

/// The thread's sockets.
pub struct SideChannel {
    /// The context all sockets come from.
    pub ctx: zmq::Context,
    /// Where peers' requests arrive.
    pub router: zmq::Socket,
    /// Where wake-ups arrive.
    pub wake: zmq::Socket,
    /// How the router is guarded and the requests' sockets connect.
    pub guard: Guard,
    /// The router is bound on `tcp://` (its peers have addresses).
    pub tcp: bool,
    /// The keys of the side channels this transport connects to.
    pub server_keys: Arc<ServerKeys>,
    /// The router's authentication handler, if it enforces anything:
    /// declared after the router, so that it outlives it.
    pub _zap: Option<Arc<ZapHandler>>,
}

/// Starts the thread.
pub fn spawn<D: Device>(
    side: SideChannel,
    book: Arc<Mutex<ConnBook<D>>>,
    news: Arc<WakeSet>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, VerbsError> {
    std::thread::Builder::new()
        .name("ferry-verbs-side".into())
        .spawn(move || run(side, &book, &news, &stop))
        .map_err(|source| VerbsError::Os {
            what: "start the verbs side-channel thread",
            source,
        })
}

fn run<D: Device>(side: SideChannel, book: &Mutex<ConnBook<D>>, news: &WakeSet, stop: &AtomicBool) {
    let mut dealers: Vec<(u32, zmq::Socket)> = Vec::new();
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    while !stop.load(Ordering::Acquire) {
        let outgoing = {
            let mut b = lock(book);
            let out = b.start_wanted();
            if b.take_news() {
                news.signal();
            }
            out
        };
        for o in outgoing {
            match request(&side, &o.endpoint, &o.bytes) {
                Ok(s) => dealers.push((o.conn, s)),
                Err(e) => {
                    let mut b = lock(book);
                    b.on_send_failed(o.conn, e);
                    if b.take_news() {
                        news.signal();
                    }
                }
            }
        }
        {
            let b = lock(book);
            dealers.retain(|(id, _)| b.awaiting(*id));
        }
        let ready = {
            let mut items = Vec::with_capacity(2 + dealers.len());
            items.push(side.router.as_poll_item(zmq::POLLIN));
            items.push(side.wake.as_poll_item(zmq::POLLIN));
            for (_, s) in &dealers {
                items.push(s.as_poll_item(zmq::POLLIN));
            }
            let wait = i64::try_from(IDLE.as_millis()).unwrap_or(100);
            if let Err(e) = zmq::poll(&mut items, wait) {
                tracing::error!(error = %e, "verbs side channel: zmq_poll failed");
                std::thread::sleep(IDLE);
                continue;
            }
            items
                .iter()
                .map(zmq::PollItem::is_readable)
                .collect::<Vec<bool>>()
        };
        if ready[1] {
            while side.wake.recv_bytes(zmq::DONTWAIT).is_ok() {}
        }
        if ready[0] {
            answer_requests(&side, book);
        }
        for (i, (id, s)) in dealers.iter().enumerate() {
            if !ready[2 + i] {
                continue;
            }
            let got = s.recv_into(&mut buf, zmq::DONTWAIT);
            let mut b = lock(book);
            match got {
                Ok(n) if n <= MAX_MESSAGE => b.on_reply(*id, &buf[..n]),
                Ok(n) => b.on_send_failed(
                    *id,
                    VerbsError::BadExchange {
                        peer: format!("connection {id}"),
                        field: "message",
                        why: format!("{n} bytes, at most {MAX_MESSAGE}"),
                    },
                ),
                Err(zmq::Error::EAGAIN) => continue,
                Err(e) => b.on_send_failed(*id, side_err("receive a reply", None, e)),
            }
            // Writes the reply failed are news for the caller's thread
            // (the ones it posted raise CQ events). Signalled under the
            // lock, after the book changed, so a wait that starts later
            // sees it.
            if b.take_news() {
                news.signal();
            }
        }
    }
}

/// A DEALER socket connected to the side channel at `endpoint` (as a CURVE
/// client if it has a key), with `bytes` sent on it.
fn request(side: &SideChannel, endpoint: &str, bytes: &[u8]) -> Result<zmq::Socket, VerbsError> {
    let failed = |e| side_err("send a connection request", Some(endpoint), e);
    let s = side.ctx.socket(zmq::DEALER).map_err(failed)?;
    s.set_linger(0).map_err(failed)?;
    s.set_ipv6(true).map_err(failed)?;
    // A reply larger than any exchange message drops the connection (the
    // request then times out) rather than be received whole.
    s.set_maxmsgsize(MAX_FRAME).map_err(failed)?;
    side.guard
        .client(&s, endpoint, side.server_keys.of(endpoint).as_ref())
        .map_err(|source| VerbsError::Guard {
            peer: Some(endpoint.to_owned()),
            source,
        })?;
    s.connect(endpoint).map_err(failed)?;
    s.send(bytes, zmq::DONTWAIT).map_err(failed)?;
    Ok(s)
}

/// Who sent `msg` (a request's frame), as its connection proves it: under
/// CURVE, the key the ZAP handler named it by ("User-Id"); without, over
/// TCP, the peer's address ("Peer-Address"); otherwise the connection's
/// routing id (over `ipc://` libzmq names every peer `localhost`, which
/// would make every process on the host one requester, free to replace
/// another's queue pair). `Err`: a CURVE connection without a key, which
/// the handler never admits.
fn requester(
    msg: &zmq::Message,
    routing_id: &[u8],
    curve: bool,
    tcp: bool,
) -> Result<Requester, String> {
    if curve {
        let user = msg.gets("User-Id").unwrap_or_default();
        return CurvePublicKey::from_z85(user)
            .map(Requester::Key)
            .map_err(|e| format!("the connection carries no CURVE key ({e})"));
    }
    match msg.gets("Peer-Address") {
        Some(a) if tcp && !a.is_empty() => Ok(Requester::Address(a.to_owned())),
        _ => Ok(Requester::Connection(routing_id.to_vec())),
    }
}

fn answer_requests<D: Device>(side: &SideChannel, book: &Mutex<ConnBook<D>>) {
    let router = &side.router;
    let curve = side.guard.curve.is_some();
    let tcp = side.tcp;
    let mut msg = zmq::Message::new();
    loop {
        let identity = match router.recv_bytes(zmq::DONTWAIT) {
            Ok(id) => id,
            Err(zmq::Error::EAGAIN) => return,
            Err(e) => {
                tracing::warn!(error = %e, "verbs side channel: receive failed");
                return;
            }
        };
        if !router.get_rcvmore().unwrap_or(false) {
            continue;
        }
        // Into a message, for the metadata of the connection it came over.
        if let Err(e) = router.recv(&mut msg, zmq::DONTWAIT) {
            tracing::warn!(error = %e, "verbs side channel: receive failed");
            return;
        }
        // Anything past a second frame is not ours; drain it.
        while router.get_rcvmore().unwrap_or(false) {
            if router.recv_bytes(zmq::DONTWAIT).is_err() {
                break;
            }
        }
        let who = requester(&msg, &identity, curve, tcp);
        let n = msg.len();
        let reply = match &who {
            Err(why) => {
                tracing::warn!(why = %why, "verbs side channel: a request from no known requester refused");
                crate::exchange::Reply::Refuse { why: why.clone() }
            }
            // libzmq's MAXMSGSIZE keeps these out; checked all the same.
            Ok(_) if n > MAX_MESSAGE => crate::exchange::Reply::Refuse {
                why: format!("request of {n} bytes, at most {MAX_MESSAGE}"),
            },
            Ok(who) => lock(book).on_request(&msg, who),
        };
        let bytes = reply.encode();
        let frames: [&[u8]; 2] = [&identity, &bytes];
        if let Err(e) = router.send_multipart(frames, zmq::DONTWAIT) {
            let peer = match &who {
                Ok(w) => w.to_string(),
                Err(_) => format!("on connection {}", hex(&identity)),
            };
            tracing::warn!(error = %e, peer = %peer, "verbs side channel: reply not sent");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
