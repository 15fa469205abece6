//! [`ZmqChannel`]: binding the PULL sockets, and the split into a sender
//! and a receiver.

use std::collections::HashMap;
use std::sync::mpsc;

use ferry_core::transport::ControlChannel;

use crate::config::ZmqConfig;
use crate::error::{sys, ZmqError};
use crate::recv::ZmqReceiver;
use crate::send::ZmqSender;
use crate::zap;

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
    /// at those addresses can connect to its `tcp://` endpoints: ZeroMQ's
    /// authentication protocol (ZAP) puts every new connection to a
    /// handler this channel runs in `ctx`, which refuses (and logs) the
    /// others before any message of theirs is read. One such channel per
    /// context.
    pub fn bind_allowing(
        ctx: &zmq::Context,
        endpoints: &[&str],
        settings: ZmqConfig,
        allow: &[std::net::IpAddr],
    ) -> Result<Self, ZmqError> {
        let zap = if allow.is_empty() {
            None
        } else {
            Some(zap::ZapHandler::start(ctx, allow.to_vec())?)
        };
        let mut pulls = Vec::new();
        for &e in endpoints {
            let s = ctx.socket(zmq::PULL).map_err(sys("socket(PULL)", e))?;
            if zap.is_some() && e.starts_with("tcp://") {
                s.set_zap_domain(zap::DOMAIN)
                    .map_err(sys("setsockopt(ZAP_DOMAIN)", e))?;
            }
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
                pushes: HashMap::new(),
                monitors: monitors_tx,
                me,
            },
            receiver: ZmqReceiver {
                pulls,
                monitors: Vec::new(),
                reached: Vec::new(),
                new_monitors: monitors_rx,
                _zap: zap,
                next: 0,
                gone: String::new(),
            },
        })
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
