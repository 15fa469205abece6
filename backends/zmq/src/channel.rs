//! [`ZmqChannel`]: binding the PULL sockets, and the split into a sender
//! and a receiver.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};

use tensorferry_core::transport::ControlChannel;

use crate::config::ZmqConfig;
use crate::error::{sys, ZmqError};
use crate::guard::Guard;
use crate::learn::ServerKeys;
use crate::recv::ZmqReceiver;
use crate::send::ZmqSender;
use crate::zmq;

/// A control channel: PULL sockets bound where it receives, PUSH sockets
/// to where it sends.
pub struct ZmqChannel {
    sender: ZmqSender,
    receiver: ZmqReceiver,
}

impl std::fmt::Debug for ZmqChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqChannel")
            .field("endpoints", &self.receiver.endpoints())
            .finish_non_exhaustive()
    }
}

impl ZmqChannel {
    /// Binds a PULL socket at each of `endpoints` (`tcp://host:port`,
    /// `ipc://path`); the first is the channel's own endpoint.
    pub fn bind(
        ctx: &zmq::Context,
        endpoints: &[&str],
        settings: ZmqConfig,
    ) -> Result<Self, ZmqError> {
        Self::bind_allowing(ctx, endpoints, settings, &[])
    }

    /// Like [`bind`](Self::bind), and with a non-empty `allow`, only peers
    /// at those addresses can connect to its `tcp://` endpoints (see
    /// [`bind_guarded`](Self::bind_guarded)).
    pub fn bind_allowing(
        ctx: &zmq::Context,
        endpoints: &[&str],
        settings: ZmqConfig,
        allow: &[std::net::IpAddr],
    ) -> Result<Self, ZmqError> {
        Self::bind_guarded(ctx, endpoints, settings, &Guard::allowing(allow))
    }

    /// Like [`bind`](Self::bind), behind `guard`: ZeroMQ's authentication
    /// protocol (ZAP) puts every new connection to its sockets to a
    /// handler this channel runs in `ctx`, which refuses (and logs) the
    /// peers the guard does not admit before any message of theirs is
    /// read. With CURVE, every endpoint it binds is a CURVE server with the
    /// guard's key admitting only its peers' keys, and every peer it sends
    /// to is reached as a CURVE client (see `learn.rs` for how it knows
    /// their keys), so that every message is encrypted and authenticated
    /// by its connection. One such channel per context.
    pub fn bind_guarded(
        ctx: &zmq::Context,
        endpoints: &[&str],
        settings: ZmqConfig,
        guard: &Guard,
    ) -> Result<Self, ZmqError> {
        let zap = guard.start(ctx)?;
        let keys = guard.curve.as_ref().map(|c| Arc::new(ServerKeys::new(c)));
        let mut pulls = Vec::new();
        for &e in endpoints {
            let s = ctx.socket(zmq::PULL).map_err(sys("socket(PULL)", e))?;
            guard.server(&s, e)?;
            s.set_rcvhwm(settings.recv_hwm)
                .map_err(sys("setsockopt(RCVHWM)", e))?;
            s.set_maxmsgsize(settings.max_message)
                .map_err(sys("setsockopt(MAXMSGSIZE)", e))?;
            s.set_linger(0).map_err(sys("setsockopt(LINGER)", e))?;
            s.bind(e).map_err(sys("bind", e))?;
            // A tcp port 0 or wildcard resolves to the real address.
            let bound = s
                .get_last_endpoint()
                .ok()
                .and_then(Result::ok)
                .unwrap_or_else(|| e.to_owned());
            pulls.push((bound, s));
        }
        if pulls.is_empty() {
            return Err(ZmqError::Malformed {
                via: String::new(),
                why: "no endpoint to bind",
            });
        }
        let (monitors_tx, monitors_rx) = mpsc::channel();
        let me = pulls[0].0.clone();
        Ok(Self {
            sender: ZmqSender {
                ctx: ctx.clone(),
                settings,
                guard: guard.clone(),
                keys: keys.clone(),
                seen_changes: 0,
                pushes: HashMap::new(),
                monitors: monitors_tx,
                me,
            },
            receiver: ZmqReceiver {
                pulls,
                monitors: Vec::new(),
                reached: Vec::new(),
                new_monitors: monitors_rx,
                keys,
                frame: zmq::Message::new(),
                user: String::new(),
                zap,
                next: 0,
                gone: String::new(),
                spin_until: std::time::Instant::now(),
            },
        })
    }

    /// Connections its guard refused so far.
    pub fn refused(&self) -> u64 {
        self.receiver.refused()
    }

    /// The endpoints it receives at, as bound.
    pub fn endpoints(&self) -> Vec<String> {
        self.receiver.endpoints()
    }
}

impl ControlChannel for ZmqChannel {
    type Sender = ZmqSender;
    type Receiver = ZmqReceiver;

    fn split(self) -> (ZmqSender, ZmqReceiver) {
        (self.sender, self.receiver)
    }
}
