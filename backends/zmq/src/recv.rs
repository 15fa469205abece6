//! [`ZmqReceiver`]: the PULL sockets, and the monitors of the sender's
//! PUSH sockets (which tell a peer gone).

use std::os::fd::RawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{ChannelEvent, ControlRecv, FaultKind, Incoming};
use tensorferry_core::wire::{Msg, TRANSFER_MAGIC};

use crate::curve::CurvePublicKey;
use crate::error::{sys, ZmqError};
use crate::learn::ServerKeys;
use crate::zap::ZapHandler;
use crate::zmq;

/// How far a sender's connection to a peer got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Not yet connected.
    Never,
    /// Connected at least once.
    Connected,
    /// Its first connection failed, and that was reported.
    Unreachable,
}

/// The receiving side: the PULL sockets, and the monitors of the sender's
/// PUSH sockets.
pub struct ZmqReceiver {
    pub(crate) pulls: Vec<(String, zmq::Socket)>,
    pub(crate) monitors: Vec<(String, zmq::Socket)>,
    /// Per monitor: its peer was connected once, and (if not) whether its
    /// being unreachable was reported.
    pub(crate) reached: Vec<Reach>,
    pub(crate) new_monitors: mpsc::Receiver<(String, zmq::Socket)>,
    /// With CURVE, the server keys the sender connects with, learnt from
    /// the registrations read here.
    pub(crate) keys: Option<Arc<ServerKeys>>,
    /// With CURVE, each message's first frame is read into this, for the
    /// key of the connection it came over (its User-Id).
    pub(crate) frame: zmq::Message,
    /// That key, in Z85.
    pub(crate) user: String,
    /// The guard's handler, if it enforces anything: declared after the
    /// sockets it guards, so that it outlives them.
    pub(crate) zap: Option<ZapHandler>,
    pub(crate) next: usize,
    pub(crate) gone: String,
    /// Until when a wait polls without sleeping: [`SPIN`] past the last
    /// message, when the next of a conversation is likely near.
    pub(crate) spin_until: Instant,
}

/// How long after a message a wait for the next polls without sleeping:
/// about a round trip of a few messages between processes of one host,
/// so that the answer to what a node just sent is taken without this
/// thread's sleep and wake (a context switch each, and an idle core's way
/// out of its idle state); past it, a wait sleeps in `zmq_poll`.
const SPIN: Duration = Duration::from_micros(100);

/// A yield that takes this long ran another thread on the core: the poll
/// shares its core, and would take that thread's turns rather than save a
/// wake.
const SHARED_CORE: Duration = Duration::from_micros(5);

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
    /// The endpoints it receives at, as bound.
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.pulls.iter().map(|(e, _)| e.clone()).collect()
    }

    /// Connections its guard refused so far.
    pub fn refused(&self) -> u64 {
        self.zap.as_ref().map_or(0, ZapHandler::refused)
    }

    /// Reads one message from pull `i` without waiting.
    fn read(&mut self, i: usize, buf: &mut [u8]) -> Result<Got, ZmqError> {
        let got = self.read_frames(i, buf)?;
        if let (Got::Message(_, magic, end), Some(keys)) = (&got, &self.keys) {
            learn(keys, &self.user, &buf[..*magic], &buf[*magic..*end]);
        }
        Ok(got)
    }

    /// The first frame into `buf`; with CURVE, through `frame`, so that the
    /// connection's key is read as well.
    fn first_frame(&mut self, i: usize, buf: &mut [u8]) -> Result<Option<usize>, ZmqError> {
        let (via, s) = &self.pulls[i];
        if self.keys.is_none() {
            return match s.recv_into(buf, zmq::DONTWAIT) {
                Ok(n) => Ok(Some(n)),
                Err(zmq::Error::EAGAIN) => Ok(None),
                Err(e) => Err(sys("recv", via)(e)),
            };
        }
        match s.recv(&mut self.frame, zmq::DONTWAIT) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(sys("recv", via)(e)),
        }
        let n = self.frame.len();
        let k = n.min(buf.len());
        buf[..k].copy_from_slice(&self.frame[..k]);
        self.user.clear();
        if let Some(u) = self.frame.gets("User-Id") {
            self.user.push_str(u);
        }
        Ok(Some(n))
    }

    fn read_frames(&mut self, i: usize, buf: &mut [u8]) -> Result<Got, ZmqError> {
        let Some(n0) = self.first_frame(i, buf)? else {
            return Ok(Got::Nothing);
        };
        let (via, s) = &self.pulls[i];
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
            return if &buf[..n0] == TRANSFER_MAGIC {
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

    fn fault_kind(error: &ZmqError) -> FaultKind {
        error.kind()
    }

    fn local_endpoint(&self) -> &str {
        &self.pulls[0].0
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<RawFd>,
    ) -> Result<Option<ChannelEvent<'b>>, ZmqError> {
        while let Ok(m) = self.new_monitors.try_recv() {
            // A connection made anew (its peer's key changed) replaces the
            // old one's monitor, whose last events are not news.
            match self.monitors.iter().position(|(e, _)| *e == m.0) {
                Some(k) => {
                    self.monitors[k] = m;
                    self.reached[k] = Reach::Never;
                }
                None => {
                    self.monitors.push(m);
                    self.reached.push(Reach::Never);
                }
            }
        }
        let deadline = Instant::now() + wait;
        let got = loop {
            match self.sweep(buf)? {
                Got::Nothing => {}
                got => break got,
            }
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Ok(None);
            }
            let spinning = now < self.spin_until;
            let mut items: Vec<zmq::PollItem<'_>> = self
                .pulls
                .iter()
                .chain(&self.monitors)
                .map(|(_, s)| s.as_poll_item(zmq::POLLIN))
                .collect();
            if let Some(fd) = wake {
                items.push(zmq::PollItem::from_fd(fd, zmq::POLLIN));
            }
            let ms = if spinning {
                0
            } else {
                left.as_millis().clamp(1, i64::MAX as u128) as i64
            };
            match zmq::poll(&mut items, ms) {
                Ok(0) if spinning => {
                    // Yielded to whoever wants the core: if another thread
                    // took it, polling would take its turns, so this wait
                    // sleeps instead.
                    let t0 = Instant::now();
                    std::thread::yield_now();
                    if t0.elapsed() >= SHARED_CORE {
                        self.spin_until = now;
                    }
                }
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
                // Its key goes with its connection: whoever registers the
                // endpoint next is learnt (see `learn.rs`).
                if let Some(keys) = &self.keys {
                    keys.forget(&self.gone);
                }
                Some(ChannelEvent::Gone { from: &self.gone })
            }
            Got::Message(i, magic, end) => {
                self.spin_until = Instant::now() + SPIN;
                let (m, p) = buf[..end].split_at(magic);
                Some(ChannelEvent::Message(Incoming {
                    from: "",
                    via: &self.pulls[i].0,
                    // With CURVE, the key its connection was admitted with
                    // (empty without).
                    user: &self.user,
                    magic: m,
                    payload: p,
                }))
            }
        })
    }
}

/// Learns, from a registration that came over a connection authenticated
/// as `user` (a key in Z85), that the work endpoint it names is served
/// with that key (see `learn.rs`).
fn learn(keys: &ServerKeys, user: &str, magic: &[u8], payload: &[u8]) {
    const REGISTER: &[u8] = b"transfer_register";
    if magic != TRANSFER_MAGIC
        || user.is_empty()
        || !payload.windows(REGISTER.len()).any(|w| w == REGISTER)
    {
        return;
    }
    let (Ok(Msg::Register(r)), Ok(key)) = (
        tensorferry_core::wire::decode(payload),
        CurvePublicKey::from_z85(user),
    ) else {
        return;
    };
    let endpoint: String = r.work_endpoint.chars().collect();
    if !endpoint.is_empty() {
        keys.learn(&endpoint, key);
    }
}
