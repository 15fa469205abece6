//! The side channel: a thread that answers connection exchanges on a
//! ZeroMQ ROUTER socket and sends this transport's own requests, one
//! DEALER socket per connection being made.
//!
//! Callers wake it through an inproc PUSH/PULL pair when a write creates a
//! connection; otherwise it sleeps in `zmq_poll`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tensorferry_zmq::{CurvePublicKey, Guard, ZapHandler};

use crate::conn::ConnBook;
use crate::device::Device;
use crate::error::VerbsError;
use crate::exchange::MAX_MESSAGE;
use crate::session::Session;
use crate::wake::WakeSet;

/// How long the thread sleeps when nothing happens (it also checks the
/// stop flag this often).
const IDLE: Duration = Duration::from_millis(100);

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
            answer_requests(&side.router, book, &mut buf);
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

fn answer_requests<D: Device>(router: &zmq::Socket, book: &Mutex<ConnBook<D>>, buf: &mut [u8]) {
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
        let n = match router.recv_into(buf, zmq::DONTWAIT) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "verbs side channel: receive failed");
                return;
            }
        };
        // Anything past a second frame is not ours; drain it.
        while router.get_rcvmore().unwrap_or(false) {
            if router.recv_bytes(zmq::DONTWAIT).is_err() {
                break;
            }
        }
        let from = format!("side-channel peer {}", hex(&identity));
        let reply = if n > MAX_MESSAGE {
            crate::exchange::Reply::Refuse {
                why: format!("request of {n} bytes, at most {MAX_MESSAGE}"),
            }
        } else {
            lock(book).on_request(&buf[..n], &from)
        };
        let bytes = reply.encode();
        let frames: [&[u8]; 2] = [&identity, &bytes];
        if let Err(e) = router.send_multipart(frames, zmq::DONTWAIT) {
            tracing::warn!(error = %e, peer = %from, "verbs side channel: reply not sent");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
