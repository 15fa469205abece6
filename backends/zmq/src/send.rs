//! [`ZmqSender`]: a PUSH socket per destination, each watched by a monitor
//! that the receiving side reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tensorferry_core::transport::{ControlSend, FaultKind};

use crate::config::{millis, ZmqConfig};
use crate::curve::CurvePublicKey;
use crate::error::{sys, ZmqError};
use crate::guard::Guard;
use crate::learn::ServerKeys;
use crate::zmq;

/// Names monitor endpoints uniquely in the process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

/// The sending side: a PUSH socket per destination, connected on first use
/// and watched for disconnection.
pub struct ZmqSender {
    pub(crate) ctx: zmq::Context,
    pub(crate) settings: ZmqConfig,
    /// How its sockets connect (CURVE or plain).
    pub(crate) guard: Guard,
    /// With CURVE, the key each destination's server must hold.
    pub(crate) keys: Option<Arc<ServerKeys>>,
    /// `keys.changes()` when the connections were last checked against it.
    pub(crate) seen_changes: u64,
    /// A PUSH socket per destination, with the server key it was made for.
    pub(crate) pushes: HashMap<String, (zmq::Socket, Option<CurvePublicKey>)>,
    pub(crate) monitors: mpsc::Sender<(String, zmq::Socket)>,
    pub(crate) me: String,
}

impl std::fmt::Debug for ZmqSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqSender")
            .field("me", &self.me)
            .field("peers", &self.pushes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ZmqSender {
    fn push(&mut self, to: &str) -> Result<&zmq::Socket, ZmqError> {
        if let Some(keys) = &self.keys {
            let now = keys.changes();
            if now != self.seen_changes {
                // A peer came back with a new key: its connection is made
                // anew with it (the old one would never get through).
                self.seen_changes = now;
                self.pushes.retain(|to, (_, made)| keys.of(to) == *made);
            }
        }
        if !self.pushes.contains_key(to) {
            let server = match &self.keys {
                None => None,
                Some(keys) => Some(keys.of(to).ok_or_else(|| ZmqError::NoServerKey {
                    endpoint: to.to_owned(),
                })?),
            };
            let st = &self.settings;
            let s = self
                .ctx
                .socket(zmq::PUSH)
                .map_err(sys("socket(PUSH)", to))?;
            s.set_sndhwm(st.send_hwm)
                .map_err(sys("setsockopt(SNDHWM)", to))?;
            s.set_sndtimeo(millis(st.send_timeout))
                .map_err(sys("setsockopt(SNDTIMEO)", to))?;
            s.set_linger(millis(st.linger))
                .map_err(sys("setsockopt(LINGER)", to))?;
            s.set_reconnect_ivl(millis(st.reconnect))
                .map_err(sys("setsockopt(RECONNECT_IVL)", to))?;
            // A TCP connect that hangs (no host answers) counts as failed
            // after this, so that an endpoint nobody serves is found out.
            s.set_connect_timeout(millis(CONNECT_TIMEOUT))
                .map_err(sys("setsockopt(CONNECT_TIMEOUT)", to))?;
            self.guard.client(&s, to, server.as_ref())?;
            let addr = format!(
                "inproc://ferry-monitor-{}",
                MONITORS.fetch_add(1, Ordering::Relaxed)
            );
            let events = zmq::SocketEvent::DISCONNECTED as i32
                | zmq::SocketEvent::CONNECTED as i32
                | zmq::SocketEvent::CONNECT_RETRIED as i32;
            s.monitor(&addr, events).map_err(sys("monitor", to))?;
            let watch = self
                .ctx
                .socket(zmq::PAIR)
                .map_err(sys("socket(PAIR)", to))?;
            watch.connect(&addr).map_err(sys("connect(monitor)", to))?;
            s.connect(to).map_err(sys("connect", to))?;
            // The receiving side polls the monitor; if it is gone, so is
            // the channel, and nobody needs the events.
            let _ = self.monitors.send((to.to_owned(), watch));
            self.pushes.insert(to.to_owned(), (s, server));
        }
        self.pushes
            .get(to)
            .map(|(s, _)| s)
            .ok_or_else(|| ZmqError::Malformed {
                via: to.to_owned(),
                why: "connection lost",
            })
    }
}

impl ControlSend for ZmqSender {
    type Error = ZmqError;

    fn fault_kind(error: &ZmqError) -> FaultKind {
        error.kind()
    }

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), ZmqError> {
        let full = send_error(to, self.settings.send_timeout);
        let s = self.push(to)?;
        let Some((last, rest)) = parts.split_last() else {
            return Err(ZmqError::Malformed {
                via: to.to_owned(),
                why: "a message of no frames",
            });
        };
        // ZeroMQ queues a multipart message whole or not at all: once the
        // first frame is taken, the rest are.
        for p in rest {
            s.send(*p, zmq::SNDMORE).map_err(&full)?;
        }
        s.send(*last, 0).map_err(&full)
    }
}

/// A send's error: a queue that stayed full for `timeout` (EAGAIN under
/// ZMQ_SNDTIMEO), or ZeroMQ's own.
fn send_error(to: &str, timeout: Duration) -> impl Fn(zmq::Error) -> ZmqError + '_ {
    move |e| match e {
        zmq::Error::EAGAIN => ZmqError::Timeout {
            endpoint: to.to_owned(),
            millis: timeout.as_millis() as u64,
        },
        e => ZmqError::Sys {
            call: "send",
            endpoint: to.to_owned(),
            source: e,
        },
    }
}

/// How long a TCP connect may hang before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
