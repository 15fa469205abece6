//! ferry-zmq: ferry-core's `ControlChannel` over ZeroMQ, with sglang's
//! socket layout and framing.
//!
//! Every process binds PULL sockets where it receives (an instance: its
//! work endpoint; the coordinator: one result endpoint per role) and
//! connects a PUSH socket to each endpoint it sends to, on first use.
//! Transfer messages are `[b"__transfer__", json]`; other messages share
//! the sockets and are handed to the caller untouched.
//!
//! A PULL socket cannot say who sent a message, so [`Incoming::from`] is
//! empty and [`Incoming::via`] names the local endpoint it arrived at (the
//! coordinator learns the sender's role from it). Each PUSH socket is
//! monitored: when its peer's connection drops (the process died or
//! restarted), the receiving side reports the peer [`ChannelEvent::Gone`],
//! and ZeroMQ reconnects by itself when the peer comes back.
//!
//! Queues are bounded on purpose (high-water marks), a send that finds the
//! queue full fails after a short timeout instead of blocking the caller,
//! and closing lingers so that queued messages still go out.

mod zap;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::os::fd::RawFd;

use ferry_core::transport::{
    ChannelEvent, ControlChannel, ControlRecv, ControlSend, Fault, FaultKind, Incoming,
};

/// A ZeroMQ control-channel error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZmqError {
    /// A ZeroMQ call failed.
    #[error("{call} on {endpoint}: {source}")]
    Sys {
        /// The call (`bind`, `connect`, `send`, ...).
        call: &'static str,
        /// The endpoint concerned.
        endpoint: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// The peer's queue stayed full for the send timeout (the message was
    /// not sent).
    #[error(
        "peer {endpoint} did not take a message within {millis} ms (queue full or not connected)"
    )]
    Timeout {
        /// The peer's endpoint.
        endpoint: String,
        /// The send timeout.
        millis: u64,
    },
    /// A message larger than the receive buffer (dropped).
    #[error("message of {len} bytes at {via} exceeds the {cap}-byte buffer; dropped")]
    TooLarge {
        /// Where it arrived.
        via: String,
        /// Its length.
        len: usize,
        /// The buffer's size.
        cap: usize,
    },
    /// A message that is not two frames where a transfer message must be
    /// (dropped).
    #[error("malformed message at {via}: {why}; dropped")]
    Malformed {
        /// Where it arrived.
        via: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl Fault for ZmqError {
    fn kind(&self) -> FaultKind {
        match self {
            Self::Sys { .. } | Self::Malformed { .. } => FaultKind::Io,
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::TooLarge { .. } => FaultKind::TooLarge,
        }
    }
}

/// Socket options, chosen on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZmqSettings {
    /// Messages queued per peer before sends wait (ZMQ_SNDHWM).
    pub send_hwm: i32,
    /// Messages queued per receiving socket (ZMQ_RCVHWM).
    pub recv_hwm: i32,
    /// How long a send waits on a full queue before it fails.
    pub send_timeout: Duration,
    /// How long closing waits for queued messages to go out (ZMQ_LINGER).
    pub linger: Duration,
    /// Largest message a peer may send before ZeroMQ drops its
    /// connection (ZMQ_MAXMSGSIZE): a guard against memory exhaustion.
    pub max_message: i64,
    /// First reconnection attempt after a peer goes away.
    pub reconnect: Duration,
}

impl Default for ZmqSettings {
    fn default() -> Self {
        Self {
            send_hwm: 10_000,
            recv_hwm: 10_000,
            send_timeout: Duration::from_millis(100),
            linger: Duration::from_secs(2),
            max_message: 64 << 20,
            reconnect: Duration::from_millis(50),
        }
    }
}

fn sys<'e>(call: &'static str, endpoint: &'e str) -> impl FnOnce(zmq::Error) -> ZmqError + 'e {
    move |source| ZmqError::Sys {
        call,
        endpoint: endpoint.to_owned(),
        source,
    }
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

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
        settings: ZmqSettings,
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
        settings: ZmqSettings,
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

/// Names monitor endpoints uniquely in the process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

/// The sending side: a PUSH socket per destination, connected on first use
/// and watched for disconnection.
pub struct ZmqSender {
    ctx: zmq::Context,
    settings: ZmqSettings,
    pushes: HashMap<String, zmq::Socket>,
    monitors: mpsc::Sender<(String, zmq::Socket)>,
    me: String,
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
        if !self.pushes.contains_key(to) {
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
            self.pushes.insert(to.to_owned(), s);
        }
        self.pushes.get(to).ok_or_else(|| ZmqError::Malformed {
            via: to.to_owned(),
            why: "connection lost",
        })
    }
}

impl ControlSend for ZmqSender {
    type Error = ZmqError;

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

/// How far a sender's connection to a peer got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Not yet connected.
    Never,
    /// Connected at least once.
    Connected,
    /// Its first connection failed, and that was reported.
    Unreachable,
}

/// How long a TCP connect may hang before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The receiving side: the PULL sockets, and the monitors of the sender's
/// PUSH sockets.
pub struct ZmqReceiver {
    pulls: Vec<(String, zmq::Socket)>,
    monitors: Vec<(String, zmq::Socket)>,
    /// Per monitor: its peer was connected once, and (if not) whether its
    /// being unreachable was reported.
    reached: Vec<Reach>,
    /// The allow-list's handler, if one was asked for: it lives as long as
    /// the sockets it guards.
    _zap: Option<zap::ZapHandler>,
    new_monitors: mpsc::Receiver<(String, zmq::Socket)>,
    next: usize,
    gone: String,
}

impl Drop for ZmqReceiver {
    fn drop(&mut self) {
        for (endpoint, socket) in self.pulls.drain(..) {
            drop(socket);
            remove_ipc_file(&endpoint);
        }
    }
}

/// Removes the file an `ipc://` endpoint was bound at (nothing for other
/// transports, or an abstract `ipc://@name`). libzmq unlinks it only once
/// its I/O thread closes the listener, which a process that exits soon
/// after (or is killed) never sees; whoever bound the endpoint removes it.
pub fn remove_ipc_file(endpoint: &str) {
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        if !path.is_empty() && !path.starts_with('@') {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl std::fmt::Debug for ZmqReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqReceiver")
            .field("endpoints", &self.endpoints())
            .finish_non_exhaustive()
    }
}

/// What one socket yielded.
enum Got {
    Nothing,
    /// A message at pull `i`: frame 0 is `buf[..magic]`, frame 1
    /// `buf[magic..end]`.
    Message(usize, usize, usize),
    /// The peer of monitor `i` disconnected.
    Gone(usize),
}

impl ZmqReceiver {
    fn endpoints(&self) -> Vec<String> {
        self.pulls.iter().map(|(e, _)| e.clone()).collect()
    }

    /// Reads one message from pull `i` without waiting.
    fn read(&self, i: usize, buf: &mut [u8]) -> Result<Got, ZmqError> {
        let (via, s) = &self.pulls[i];
        let n0 = match s.recv_into(buf, zmq::DONTWAIT) {
            Ok(n) => n,
            Err(zmq::Error::EAGAIN) => return Ok(Got::Nothing),
            Err(e) => return Err(sys("recv", via)(e)),
        };
        let more = s.get_rcvmore().map_err(sys("recv", via))?;
        let drain = || {
            // The rest of a message we will not use.
            while s.get_rcvmore().unwrap_or(false) {
                let _ = s.recv_into(&mut [], 0);
            }
        };
        if n0 > buf.len() {
            drain();
            return Err(ZmqError::TooLarge {
                via: via.clone(),
                len: n0,
                cap: buf.len(),
            });
        }
        if !more {
            // One frame: a work item of the application, or a transfer
            // message missing its payload.
            return if &buf[..n0] == ferry_core::wire::TRANSFER_MAGIC {
                Err(ZmqError::Malformed {
                    via: via.clone(),
                    why: "transfer message without its second frame",
                })
            } else {
                Ok(Got::Message(i, n0, n0))
            };
        }
        let n1 = s.recv_into(&mut buf[n0..], 0).map_err(sys("recv", via))?;
        if n0 + n1 > buf.len() {
            drain();
            return Err(ZmqError::TooLarge {
                via: via.clone(),
                len: n0 + n1,
                cap: buf.len(),
            });
        }
        drain();
        Ok(Got::Message(i, n0, n0 + n1))
    }

    fn read_monitor(&mut self, i: usize) -> Got {
        let s = &self.monitors[i].1;
        let mut event = [0u8; 6];
        let Ok(n) = s.recv_into(&mut event, zmq::DONTWAIT) else {
            return Got::Nothing;
        };
        while s.get_rcvmore().unwrap_or(false) {
            let _ = s.recv_into(&mut [], 0);
        }
        if n < 2 {
            return Got::Nothing;
        }
        let code = u16::from_le_bytes([event[0], event[1]]);
        let reach = &mut self.reached[i];
        match code {
            c if c == zmq::SocketEvent::CONNECTED as u16 => {
                *reach = Reach::Connected;
                Got::Nothing
            }
            c if c == zmq::SocketEvent::DISCONNECTED as u16 => Got::Gone(i),
            // A peer never reached, whose first connection failed: an
            // endpoint nobody serves (a registration naming a ghost). Said
            // once; ZeroMQ goes on retrying, and a later connection counts.
            c if c == zmq::SocketEvent::CONNECT_RETRIED as u16 && *reach == Reach::Never => {
                *reach = Reach::Unreachable;
                Got::Gone(i)
            }
            _ => Got::Nothing,
        }
    }

    /// One pass over every socket without waiting, starting where the
    /// last one stopped.
    fn sweep(&mut self, buf: &mut [u8]) -> Result<Got, ZmqError> {
        // Messages first: what a peer sent before it closed (its last
        // words, such as `transfer_deregister`) is read before the news
        // that it is gone.
        let n = self.pulls.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            match self.read(i, buf)? {
                Got::Nothing => {}
                got => {
                    self.next = i + 1;
                    return Ok(got);
                }
            }
        }
        for k in 0..self.monitors.len() {
            if let Got::Gone(i) = self.read_monitor(k) {
                return Ok(Got::Gone(i));
            }
        }
        Ok(Got::Nothing)
    }
}

impl ControlRecv for ZmqReceiver {
    type Error = ZmqError;

    fn local_endpoint(&self) -> &str {
        &self.pulls[0].0
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
    ) -> Result<Option<ChannelEvent<'b>>, ZmqError> {
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
    ) -> Result<Option<ChannelEvent<'b>>, ZmqError> {
        self.receive(buf, wait, Some(wake))
    }
}

impl ZmqReceiver {
    fn receive<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<i32>,
    ) -> Result<Option<ChannelEvent<'b>>, ZmqError> {
        while let Ok(m) = self.new_monitors.try_recv() {
            self.monitors.push(m);
            self.reached.push(Reach::Never);
        }
        let deadline = Instant::now() + wait;
        let got = loop {
            match self.sweep(buf)? {
                Got::Nothing => {}
                got => break got,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut items: Vec<zmq::PollItem<'_>> = self
                .pulls
                .iter()
                .chain(&self.monitors)
                .map(|(_, s)| s.as_poll_item(zmq::POLLIN))
                .collect();
            if let Some(fd) = wake {
                items.push(zmq::PollItem::from_fd(fd, zmq::POLLIN));
            }
            let ms = left.as_millis().clamp(1, i64::MAX as u128) as i64;
            match zmq::poll(&mut items, ms) {
                Ok(_) | Err(zmq::Error::EINTR) => {}
                Err(e) => return Err(sys("poll", &self.pulls[0].0)(e)),
            }
            if wake.is_some() && items.last().is_some_and(zmq::PollItem::is_readable) {
                // The data plane has news; messages that came too are
                // taken on the next call.
                return Ok(None);
            }
        };
        Ok(match got {
            Got::Nothing => None,
            Got::Gone(i) => {
                // The monitor stays: the socket reconnects by itself, and a
                // later loss of the same peer is reported again.
                self.gone.clone_from(&self.monitors[i].0);
                Some(ChannelEvent::Gone { from: &self.gone })
            }
            Got::Message(i, magic, end) => {
                let (m, p) = buf[..end].split_at(magic);
                Some(ChannelEvent::Message(Incoming {
                    from: "",
                    via: &self.pulls[i].0,
                    magic: m,
                    payload: p,
                }))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(rx: &mut ZmqReceiver, buf: &mut [u8]) -> (String, Vec<u8>, Vec<u8>) {
        for _ in 0..100 {
            match rx.recv(buf, Duration::from_millis(50)) {
                Ok(Some(ChannelEvent::Message(m))) => {
                    return (m.via.to_owned(), m.magic.to_vec(), m.payload.to_vec())
                }
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
        panic!("nothing arrived");
    }

    #[test]
    fn an_allow_list_lets_only_its_addresses_through_and_finds_ghosts() {
        let ctx = zmq::Context::new();
        let allowed: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let (_own, mut rx) = ZmqChannel::bind_allowing(
            &ctx,
            &["tcp://127.0.0.1:*"],
            ZmqSettings::default(),
            &[allowed],
        )
        .unwrap()
        .split();
        let ep = rx.endpoints()[0].clone();
        let other = zmq::Context::new();
        let (mut tx, mut tx_events) =
            ZmqChannel::bind(&other, &["tcp://127.0.0.1:*"], ZmqSettings::default())
                .unwrap()
                .split();
        // The same receiver, reached from 127.0.0.1 (not on the list) and
        // from 127.0.0.2 (libzmq's `source;destination` form).
        let from_listed = format!("tcp://127.0.0.2:0;{}", ep.trim_start_matches("tcp://"));
        let mut buf = vec![0u8; 256];
        for _ in 0..5 {
            tx.send(&ep, &[b"__transfer__", b"forged"]).unwrap();
        }
        tx.send(&from_listed, &[b"__transfer__", b"listed"])
            .unwrap();
        let (_, _, payload) = next(&mut rx, &mut buf);
        assert_eq!(payload, b"listed");
        // Nothing else comes: the refused connection's messages never do.
        for _ in 0..10 {
            match rx.recv(&mut buf, Duration::from_millis(50)) {
                Ok(Some(ChannelEvent::Message(m))) => panic!("{:?} got through", m.payload),
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
        // A peer nobody serves is reported gone once its first connection
        // fails (a registration naming a ghost endpoint).
        tx.send("tcp://127.0.0.1:1", &[b"__transfer__", b"to nobody"])
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            match tx_events.recv(&mut buf, Duration::from_millis(50)) {
                Ok(Some(ChannelEvent::Gone {
                    from: "tcp://127.0.0.1:1",
                })) => break,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
            assert!(
                Instant::now() < end,
                "the unserved endpoint was not reported"
            );
        }
    }

    #[test]
    fn a_readable_descriptor_wakes_the_receiver() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let ctx = zmq::Context::new();
        let (_tx, mut rx) = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqSettings::default())
            .unwrap()
            .split();
        assert!(rx.can_wake());
        let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = vec![0u8; 64];
        w.write_all(b"x").unwrap();
        let t = Instant::now();
        assert!(rx
            .recv_or_wake(&mut buf, Duration::from_secs(10), r.as_raw_fd())
            .unwrap()
            .is_none());
        assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
    }

    #[test]
    fn frames_arrive_with_the_endpoint_they_came_in_at() {
        let ctx = zmq::Context::new();
        let (mut a, _a_rx) = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqSettings::default())
            .unwrap()
            .split();
        let ipc = format!(
            "ipc://{}/ferry-zmq-unit-{}.sock",
            std::env::temp_dir().display(),
            std::process::id()
        );
        let b =
            ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*", &ipc], ZmqSettings::default()).unwrap();
        let eps = b.endpoints();
        let (_b_tx, mut b_rx) = b.split();
        let mut buf = vec![0u8; 1024];
        a.send(&eps[0], &[b"__transfer__", b"{}"]).unwrap();
        assert_eq!(
            next(&mut b_rx, &mut buf),
            (eps[0].clone(), b"__transfer__".to_vec(), b"{}".to_vec())
        );
        a.send(&eps[1], &[b"work", b"item"]).unwrap();
        assert_eq!(
            next(&mut b_rx, &mut buf),
            (eps[1].clone(), b"work".to_vec(), b"item".to_vec())
        );
    }

    #[test]
    fn a_dropped_channel_removes_the_files_of_its_ipc_endpoints() {
        let ctx = zmq::Context::new();
        let path = std::env::temp_dir().join(format!("ferry-zmq-drop-{}.sock", std::process::id()));
        let ep = format!("ipc://{}", path.display());
        let ch = ZmqChannel::bind(&ctx, &[&ep], ZmqSettings::default()).unwrap();
        assert!(path.exists(), "bound at {ep}");
        let (tx, rx) = ch.split();
        drop(tx);
        assert!(path.exists(), "the receiving side still listens");
        drop(rx);
        assert!(!path.exists(), "{ep} left behind");
    }

    #[test]
    fn bad_frames_are_errors_and_the_channel_goes_on() {
        let ctx = zmq::Context::new();
        let b = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqSettings::default()).unwrap();
        let ep = b.endpoints()[0].clone();
        let (_b_tx, mut b_rx) = b.split();
        let raw = ctx.socket(zmq::PUSH).unwrap();
        raw.connect(&ep).unwrap();
        raw.send(&b"__transfer__"[..], 0).unwrap();
        raw.send(vec![b'x'; 5000], 0).unwrap();
        raw.send_multipart([&b"__transfer__"[..], &[b'y'; 5000][..]], 0)
            .unwrap();
        raw.send_multipart([&b"__transfer__"[..], b"{}", b"extra"], 0)
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let mut errors = Vec::new();
        let mut ok = None;
        for _ in 0..50 {
            match b_rx.recv(&mut buf, Duration::from_millis(50)) {
                Ok(Some(ChannelEvent::Message(m))) => {
                    ok = Some((m.magic.to_vec(), m.payload.to_vec()));
                    break;
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        assert_eq!(ok, Some((b"__transfer__".to_vec(), b"{}".to_vec())));
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("without its second frame"), "{errors:?}");
        assert!(errors[1].contains("5000 bytes"), "{errors:?}");
        assert!(errors[2].contains("5012 bytes"), "{errors:?}");
    }

    #[test]
    fn a_peer_that_goes_away_is_reported_gone() {
        let ctx = zmq::Context::new();
        let (mut a, mut a_rx) =
            ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqSettings::default())
                .unwrap()
                .split();
        let b = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqSettings::default()).unwrap();
        let ep = b.endpoints()[0].clone();
        let (b_tx, mut b_rx) = b.split();
        let mut buf = vec![0u8; 1024];
        a.send(&ep, &[b"__transfer__", b"{}"]).unwrap();
        next(&mut b_rx, &mut buf);
        drop((b_tx, b_rx));
        let mut gone = None;
        for _ in 0..100 {
            if let Ok(Some(ChannelEvent::Gone { from })) =
                a_rx.recv(&mut buf, Duration::from_millis(50))
            {
                gone = Some(from.to_owned());
                break;
            }
        }
        assert_eq!(gone, Some(ep));
    }
}
