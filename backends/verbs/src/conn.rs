//! The transport's bookkeeping: connections (one RC queue pair per peer
//! session this transport writes to), the queue pairs it accepted from
//! writers, the writes in flight and their completions.
//!
//! Everything here runs under the transport's lock and never blocks: the
//! side channel's thread feeds it exchange messages, the caller's thread
//! posts writes and polls completions. A connection walks
//!
//! ```text
//! Wanted ──(service thread: QP to INIT, request sent)──▶ Requested
//! Requested ──(reply: QP to RTR, RTS)──▶ Ready
//! any ──(completion error, post error, timeout, refusal)──▶ removed
//! ```
//!
//! and a removed connection fails every write it held; the next write to
//! that peer starts a new one.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use ferry_core::transport::Completion;

use crate::attrs;
use crate::chunk::{chunk_len, Window};
use crate::device::{Device, DeviceError, Keys, Wc, WriteWr};
use crate::error::VerbsError;
use crate::exchange::{QpInfo, RegionInfo, Reply, Request};
use crate::gid::gid_text;
use crate::session::Session;
use crate::status::WcStatus;

/// Hashing for the maps keyed by this book's own counters (write ids,
/// work-request ids, connection ids): nobody outside chooses these keys, so
/// SipHash's defence buys nothing, and a multiply is a tenth of its cost.
#[derive(Clone, Copy, Default)]
struct IdHash;

/// The hasher of [`IdHash`].
#[derive(Default)]
struct IdHasher(u64);

impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // hashbrown takes the bucket from the low bits and a tag from the
        // top 7: a multiply by an odd constant permutes the low bits of
        // sequential ids (no collisions among neighbours) and spreads them
        // into the top ones.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Completions polled per call.
const POLL_BATCH: usize = 64;

/// The limits the connection book keeps to (named apart from ferry-core's
/// `handshake::Limits`, which sizes the protocol machines).
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Outstanding work requests per queue pair.
    pub send_depth: u32,
    /// Largest work request.
    pub max_chunk: u32,
    /// A write not completed after this fails.
    pub write_timeout: Duration,
    /// An exchange not answered after this fails the connection.
    pub connect_timeout: Duration,
    /// Accepted queue pairs kept at most (one per writer session). A
    /// target cannot tell a writer that died from one that is idle
    /// (nothing reaches it either way), so beyond this the oldest accepted
    /// queue pair is destroyed; a writer still using it sees its next
    /// write fail and reconnects.
    pub max_writers: usize,
}

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Created by a write; the side channel has not sent the request yet.
    Wanted,
    /// The request is out.
    Requested,
    /// Connected: writes are posted.
    Ready,
}

struct Conn<Q> {
    id: u32,
    peer: String,
    session: Session,
    state: ConnState,
    /// When the connection attempt was first seen by a sweep (its connect
    /// deadline counts from there; stamping it there keeps the clock off
    /// the posting path).
    since: Option<Instant>,
    /// The book's tick at its last write (orders idle connections).
    last_used: u64,
    qp: Option<Q>,
    local: Option<QpInfo>,
    /// The peer's registered regions, as its reply listed them.
    regions: Option<Vec<RegionInfo>>,
    window: Window,
    next_seq: u32,
    /// Writes not yet fully posted, oldest first.
    queue: VecDeque<u64>,
    /// Every write of this connection not yet completed, oldest first
    /// (RC completes in order, so the one that completes is the front).
    writes: VecDeque<u64>,
}

struct Write {
    cookie: u64,
    local_addr: u64,
    /// The source region's lkey.
    lkey: u32,
    /// The destination region's rkey (found when the first chunk goes).
    rkey: u32,
    remote_addr: u64,
    len: u64,
    posted: u64,
    /// Stamped by the first sweep after the write was posted.
    deadline: Option<Instant>,
}

struct Signal {
    conn: u32,
    covered: u32,
    completes: Option<u64>,
}

/// One of this transport's registered regions: what the runtime's
/// `Region` says, and the keys the device gave it.
#[derive(Clone, Copy, Debug)]
pub struct RegisteredRegion {
    /// Region id handed to the runtime.
    pub region: u32,
    /// First byte.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Keys.
    pub keys: Keys,
}

/// A request the side channel must send.
#[derive(Debug)]
pub struct Outgoing {
    /// The connection.
    pub conn: u32,
    /// The peer's side-channel endpoint.
    pub endpoint: String,
    /// The encoded request.
    pub bytes: Vec<u8>,
}

/// The transport's state: its connections (one per peer it writes to),
/// the queue pairs it accepted from writers, the writes in flight and
/// their completions, and its registered regions.
pub struct ConnBook<D: Device> {
    // Queue pairs go before the device (and its registration) on drop.
    conns: HashMap<u32, Conn<D::Qp>, IdHash>,
    inbound: HashMap<String, D::Qp>,
    /// Writer sessions in the order they were accepted.
    inbound_order: VecDeque<String>,
    /// The device.
    pub device: D,
    by_peer: HashMap<String, u32>,
    writes: HashMap<u64, Write, IdHash>,
    signals: HashMap<u64, Signal, IdHash>,
    done: VecDeque<Completion<VerbsError>>,
    wcs: Vec<Wc>,
    /// Scratch for the work requests of one post.
    wrs: Vec<WriteWr>,
    next_conn: u32,
    next_write: u64,
    tick: u64,
    /// Work requests outstanding on every queue pair together: kept
    /// within the CQ's capacity, since a CQ that overflows goes to error.
    in_flight: u32,
    cq_capacity: u32,
    /// A pump stopped at the CQ's capacity: pump every connection once
    /// completions make room.
    cq_blocked: bool,
    arm_failed: bool,
    /// Writes finished since [`ConnBook::take_news`] last looked.
    news: bool,
    psn_seed: u64,
    /// The registered regions.
    pub regions: Vec<RegisteredRegion>,
    /// This transport's session id.
    pub me: String,
    /// Our incarnation.
    pub incarnation: u64,
    /// How often our registered regions changed (see [`Session`]).
    pub generation: u32,
    /// The local GID index and GID.
    pub gid: (u8, [u8; 16]),
    limits: ConnLimits,
}

fn verb(e: DeviceError, peer: &str) -> VerbsError {
    VerbsError::Verb {
        verb: e.verb,
        errno: e.errno,
        peer: Some(peer.to_owned()),
    }
}

impl<D: Device> ConnBook<D> {
    /// A book over an opened device.
    pub fn new(
        device: D,
        me: String,
        incarnation: u64,
        gid: (u8, [u8; 16]),
        limits: ConnLimits,
    ) -> Self {
        let cq_capacity = device.cq_capacity().max(2);
        Self {
            conns: HashMap::default(),
            inbound: HashMap::new(),
            inbound_order: VecDeque::new(),
            device,
            by_peer: HashMap::new(),
            writes: HashMap::default(),
            signals: HashMap::default(),
            done: VecDeque::new(),
            wcs: Vec::with_capacity(POLL_BATCH),
            wrs: Vec::new(),
            next_conn: 1,
            next_write: 1,
            tick: 0,
            in_flight: 0,
            cq_capacity,
            cq_blocked: false,
            arm_failed: false,
            news: false,
            psn_seed: incarnation,
            regions: Vec::new(),
            me,
            incarnation,
            generation: 0,
            gid,
            limits,
        }
    }

    /// A fresh 24-bit PSN (per connection, never the same twice in a row).
    fn psn(&mut self) -> u32 {
        // splitmix64 over a per-transport random seed.
        self.psn_seed = self.psn_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.psn_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) & 0xff_ffff) as u32
    }

    fn local_info(&self, qpn: u32, psn: u32) -> QpInfo {
        let port = self.device.port();
        QpInfo {
            qpn,
            lid: port.lid,
            gid: self.gid.1,
            psn,
            mtu: port.active_mtu,
        }
    }

    /// Queues a write of `len` bytes from `local_addr` (inside the
    /// registered region `lkey` names) to `dest_addr` in the peer `dest`.
    /// Returns whether the side channel must be woken (a new connection
    /// was made).
    pub fn post(
        &mut self,
        dest: &str,
        (local_addr, lkey): (u64, u32),
        len: u64,
        dest_addr: u64,
        cookie: u64,
    ) -> Result<bool, VerbsError> {
        self.tick += 1;
        let (conn_id, fresh) = match self.by_peer.get(dest) {
            Some(&id) => (id, false),
            None => {
                let session = Session::parse(dest)?;
                self.make_room(dest);
                let id = self.next_conn;
                self.next_conn = self.next_conn.wrapping_add(1).max(1);
                self.conns.insert(
                    id,
                    Conn {
                        id,
                        peer: dest.to_owned(),
                        session,
                        state: ConnState::Wanted,
                        since: None,
                        last_used: self.tick,
                        qp: None,
                        local: None,
                        regions: None,
                        window: Window::new(self.limits.send_depth),
                        next_seq: 0,
                        queue: VecDeque::new(),
                        writes: VecDeque::new(),
                    },
                );
                self.by_peer.insert(dest.to_owned(), id);
                (id, true)
            }
        };
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return Err(VerbsError::Broken {
                peer: dest.to_owned(),
                why: "connection vanished".into(),
            });
        };
        conn.last_used = self.tick;
        if let Some(regions) = &conn.regions {
            check_dest(&conn.peer, regions, dest_addr, len)?;
        }
        if len == 0 {
            // Nothing moves; an RDMA WRITE with a zero-length scatter entry
            // means 2 GiB on some NICs, so none is posted.
            self.finish(Completion {
                cookie,
                result: Ok(()),
            });
            return Ok(fresh);
        }
        let id = self.next_write;
        self.next_write += 1;
        self.writes.insert(
            id,
            Write {
                cookie,
                local_addr,
                lkey,
                rkey: 0,
                remote_addr: dest_addr,
                len,
                posted: 0,
                deadline: None,
            },
        );
        conn.queue.push_back(id);
        conn.writes.push_back(id);
        if conn.state == ConnState::Ready {
            self.pump(conn_id);
        }
        Ok(fresh)
    }

    /// Keeps at most `max_writers` connections: peers come and go (a
    /// restarted peer has a new session), so beyond that the connection
    /// idle the longest is closed. One with writes in flight is never
    /// closed for room.
    fn make_room(&mut self, for_peer: &str) {
        if self.conns.len() < self.limits.max_writers.max(1) {
            return;
        }
        let idle = self
            .conns
            .values()
            .filter(|c| c.writes.is_empty())
            .min_by_key(|c| c.last_used)
            .map(|c| (c.id, c.peer.clone()));
        if let Some((id, peer)) = idle {
            tracing::info!(peer = %peer, new_peer = %for_peer, "verbs: idle connection closed to make room");
            self.close_conn(id);
        }
    }

    /// Takes a connection out of the book: its queue pair goes to ERR
    /// (which stops retransmission, so nothing of a failed write lands
    /// later) and is destroyed with the returned value; its work requests
    /// leave the CQ's count. Its writes are the caller's to settle.
    fn close_conn(&mut self, conn_id: u32) -> Option<Conn<D::Qp>> {
        let mut conn = self.conns.remove(&conn_id)?;
        if self.by_peer.get(&conn.peer) == Some(&conn_id) {
            self.by_peer.remove(&conn.peer);
        }
        if let Some(qp) = conn.qp.as_mut() {
            // A failure here changes nothing: the QP is destroyed next.
            let _ = self.device.modify(qp, &attrs::QpStep::Error);
        }
        self.signals.retain(|_, s| s.conn != conn_id);
        self.in_flight = self.in_flight.saturating_sub(conn.window.in_flight());
        Some(conn)
    }

    /// Posts what the connection's window has room for.
    fn pump(&mut self, conn_id: u32) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let Some(regions) = conn.regions.as_ref() else {
            return;
        };
        let mut wrs = std::mem::take(&mut self.wrs);
        wrs.clear();
        let mut refused = Vec::new();
        while conn.window.has_room() {
            if self.in_flight >= self.cq_capacity {
                self.cq_blocked = true;
                break;
            }
            let Some(&wid) = conn.queue.front() else {
                break;
            };
            let Some(w) = self.writes.get_mut(&wid) else {
                conn.queue.pop_front();
                continue;
            };
            if w.posted == 0 {
                match check_dest(&conn.peer, regions, w.remote_addr, w.len) {
                    Ok(rkey) => w.rkey = rkey,
                    Err(e) => {
                        conn.queue.pop_front();
                        refused.push((wid, e));
                        continue;
                    }
                }
            }
            let n = chunk_len(w.len, w.posted, self.limits.max_chunk);
            let last = w.posted + u64::from(n) == w.len;
            let wr_id = (u64::from(conn.id) << 32) | u64::from(conn.next_seq);
            conn.next_seq = conn.next_seq.wrapping_add(1);
            // The last chunk of a write is signaled, and so is one that
            // fills the CQ's share: the completion that frees room must
            // come.
            let fills_cq = self.in_flight + 1 >= self.cq_capacity;
            let signaled = conn.window.take(last || fills_cq);
            self.in_flight += 1;
            if let Some(covered) = signaled {
                self.signals.insert(
                    wr_id,
                    Signal {
                        conn: conn.id,
                        covered,
                        completes: last.then_some(wid),
                    },
                );
            }
            wrs.push(WriteWr {
                wr_id,
                local_addr: w.local_addr + w.posted,
                lkey: w.lkey,
                len: n,
                remote_addr: w.remote_addr + w.posted,
                rkey: w.rkey,
                signaled: signaled.is_some(),
            });
            w.posted += u64::from(n);
            if last {
                conn.queue.pop_front();
            }
        }
        for (wid, e) in refused {
            forget(&mut conn.writes, wid);
            if let Some(w) = self.writes.remove(&wid) {
                // `finish`, spelled out: `conn` still borrows the table.
                self.done.push_back(Completion {
                    cookie: w.cookie,
                    result: Err(e),
                });
                self.news = true;
            }
        }
        let Some(qp) = conn.qp.as_mut().filter(|_| !wrs.is_empty()) else {
            self.wrs = wrs;
            return;
        };
        // SAFETY: every source range was checked against its registered
        // region when the write was accepted, and every destination
        // against the region the peer announced with this rkey.
        #[allow(unsafe_code)]
        let posted = unsafe { self.device.post_writes(qp, &wrs) };
        self.wrs = wrs;
        if let Err(e) = posted {
            let peer = conn.peer.clone();
            self.fail_conn(conn_id, verb(e, &peer));
        }
    }

    /// Removes a connection: its queue pair goes to ERR and is destroyed,
    /// and each of its writes fails (the first with `first`, the others as
    /// abandoned).
    fn fail_conn(&mut self, conn_id: u32, first: VerbsError) {
        let Some(mut conn) = self.close_conn(conn_id) else {
            return;
        };
        let why = first.to_string();
        tracing::warn!(peer = %conn.peer, error = %first, writes = conn.writes.len(), "verbs connection failed");
        let mut first = Some(first);
        for wid in conn.writes.drain(..) {
            let Some(w) = self.writes.remove(&wid) else {
                continue;
            };
            let e = first.take().unwrap_or_else(|| VerbsError::Broken {
                peer: conn.peer.clone(),
                why: why.clone(),
            });
            self.finish(Completion {
                cookie: w.cookie,
                result: Err(e),
            });
        }
    }

    /// Connections the side channel must start: each gets its queue pair
    /// (RESET → INIT) and an encoded request.
    pub fn start_wanted(&mut self) -> Vec<Outgoing> {
        let wanted: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.state == ConnState::Wanted)
            .map(|c| c.id)
            .collect();
        let mut out = Vec::new();
        for id in wanted {
            match self.make_qp() {
                Ok((qp, info)) => {
                    let Some(conn) = self.conns.get_mut(&id) else {
                        continue;
                    };
                    conn.qp = Some(qp);
                    conn.local = Some(info);
                    conn.state = ConnState::Requested;
                    let req = Request {
                        from: self.me.clone(),
                        to: conn.session.incarnation,
                        qp: info,
                    };
                    out.push(Outgoing {
                        conn: id,
                        endpoint: conn.session.endpoint.clone(),
                        bytes: req.encode(),
                    });
                }
                Err(e) => {
                    let peer = self
                        .conns
                        .get(&id)
                        .map(|c| c.peer.clone())
                        .unwrap_or_default();
                    self.fail_conn(id, verb(e, &peer));
                }
            }
        }
        out
    }

    fn make_qp(&mut self) -> Result<(D::Qp, QpInfo), DeviceError> {
        let depth = self.limits.send_depth.min(self.device.port().max_qp_wr);
        let mut qp = self.device.create_qp(depth)?;
        let init = attrs::init(self.device.port());
        self.device.modify(&mut qp, &init)?;
        let psn = self.psn();
        let info = self.local_info(self.device.qp_num(&qp), psn);
        Ok((qp, info))
    }

    /// True while the connection waits for its reply (the side channel
    /// drops its request socket otherwise).
    pub fn awaiting(&self, conn: u32) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.state == ConnState::Requested)
    }

    /// Walks a requested connection to RTS with the peer's reply.
    pub fn on_reply(&mut self, conn_id: u32, bytes: &[u8]) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        if conn.state != ConnState::Requested {
            return;
        }
        let peer = conn.peer.clone();
        let reply = match Reply::decode(bytes, &peer) {
            Ok(r) => r,
            Err(e) => return self.fail_conn(conn_id, e),
        };
        let (remote, regions) = match reply {
            Reply::Accept { qp, regions } => (qp, regions),
            Reply::Refuse { why } => {
                return self.fail_conn(conn_id, VerbsError::Refused { peer, why })
            }
        };
        let rtr = attrs::rtr(self.device.port(), self.gid.0, &remote);
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let sq_psn = conn.local.map_or(0, |l| l.psn);
        let Some(qp) = conn.qp.as_mut() else {
            return;
        };
        if let Err(e) = self.device.modify(qp, &rtr) {
            let err = rtr_error(e, &peer, self.gid.0, &remote);
            return self.fail_conn(conn_id, err);
        }
        if let Err(e) = self.device.modify(qp, &attrs::rts(sq_psn)) {
            return self.fail_conn(conn_id, verb(e, &peer));
        }
        conn.regions = Some(regions);
        conn.state = ConnState::Ready;
        tracing::debug!(peer = %peer, remote_qpn = remote.qpn, "verbs connection ready");
        self.pump(conn_id);
    }

    /// The side channel could not send a connection's request.
    pub fn on_send_failed(&mut self, conn_id: u32, e: VerbsError) {
        self.fail_conn(conn_id, e);
    }

    /// Answers a writer's request: a queue pair walked to RTS toward it,
    /// and our registered regions.
    pub fn on_request(&mut self, bytes: &[u8], from: &str) -> Reply {
        let req = match Request::decode(bytes, from) {
            Ok(r) => r,
            Err(e) => return Reply::Refuse { why: e.to_string() },
        };
        if req.to != self.incarnation {
            return Reply::Refuse {
                why: format!(
                    "stale session: this endpoint is now {} (incarnation {:016x}, not {:016x})",
                    self.me, self.incarnation, req.to
                ),
            };
        }
        if self.regions.is_empty() {
            return Reply::Refuse {
                why: "no memory is registered yet".into(),
            };
        }
        // A writer that reconnects replaces its old queue pair.
        if self.inbound.remove(&req.from).is_some() {
            self.inbound_order.retain(|w| *w != req.from);
        }
        while self.inbound.len() >= self.limits.max_writers.max(1) {
            let Some(oldest) = self.inbound_order.pop_front() else {
                break;
            };
            tracing::info!(writer = %oldest, "verbs: oldest accepted connection dropped to make room");
            self.inbound.remove(&oldest);
        }
        match self.accept(&req) {
            Ok((qp, info)) => {
                self.inbound.insert(req.from.clone(), qp);
                self.inbound_order.push_back(req.from.clone());
                tracing::debug!(writer = %req.from, "verbs connection accepted");
                Reply::Accept {
                    qp: info,
                    regions: self
                        .regions
                        .iter()
                        .map(|r| RegionInfo {
                            addr: r.addr,
                            len: r.len,
                            rkey: r.keys.rkey,
                        })
                        .collect(),
                }
            }
            Err(e) => {
                tracing::warn!(writer = %req.from, error = %e, "verbs connection refused");
                Reply::Refuse { why: e.to_string() }
            }
        }
    }

    fn accept(&mut self, req: &Request) -> Result<(D::Qp, QpInfo), VerbsError> {
        let (mut qp, info) = self.make_qp().map_err(|e| verb(e, &req.from))?;
        let rtr = attrs::rtr(self.device.port(), self.gid.0, &req.qp);
        self.device
            .modify(&mut qp, &rtr)
            .map_err(|e| rtr_error(e, &req.from, self.gid.0, &req.qp))?;
        self.device
            .modify(&mut qp, &attrs::rts(info.psn))
            .map_err(|e| verb(e, &req.from))?;
        Ok((qp, info))
    }

    /// Reaps completions; returns the next finished write. Reading no
    /// clock, it leaves deadlines to [`ConnBook::sweep`].
    pub fn poll(&mut self) -> Option<Completion<VerbsError>> {
        // The caller is looking: whatever is finished, it will see.
        self.news = false;
        if let Some(c) = self.done.pop_front() {
            return Some(c);
        }
        self.reap();
        if self.done.is_empty() {
            // About to report nothing, so the caller may sleep: arm, then
            // poll once more (a completion after arming raises an event,
            // one before it is found by this poll). Arming only here keeps
            // its syscall off the path of a busy CQ.
            if let Err(e) = self.device.arm() {
                if !self.arm_failed {
                    tracing::warn!(
                        verb = e.verb.name(),
                        errno = e.errno,
                        "verbs: completion events unavailable; completions are found by polling"
                    );
                    self.arm_failed = true;
                }
            }
            self.reap();
        }
        if self.cq_blocked {
            self.cq_blocked = false;
            let ready: Vec<u32> = self
                .conns
                .values()
                .filter(|c| c.state == ConnState::Ready && !c.queue.is_empty())
                .map(|c| c.id)
                .collect();
            for id in ready {
                self.pump(id);
            }
        }
        self.done.pop_front()
    }

    /// Reports a finished write.
    fn finish(&mut self, c: Completion<VerbsError>) {
        self.done.push_back(c);
        self.news = true;
    }

    /// True (once) if writes finished since the last call: the side
    /// channel's thread then wakes the caller, who would not otherwise
    /// look.
    pub fn take_news(&mut self) -> bool {
        std::mem::take(&mut self.news)
    }

    /// Polls one batch of completions and applies them.
    fn reap(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        if let Err(e) = self.device.poll(&mut wcs, POLL_BATCH) {
            // A CQ in error cannot say which write failed: every
            // connection fails.
            self.fail_every(|peer| verb(e, peer));
        }
        for wc in &wcs {
            self.on_wc(wc);
        }
        self.wcs = wcs;
    }

    fn on_wc(&mut self, wc: &Wc) {
        let conn_id = (wc.wr_id >> 32) as u32;
        if wc.status != WcStatus::SUCCESS {
            let Some(conn) = self.conns.get(&conn_id) else {
                return; // a flush of a connection already failed
            };
            let e = VerbsError::Completion {
                peer: conn.peer.clone(),
                status: wc.status,
                vendor_err: wc.vendor_err,
            };
            return self.fail_conn(conn_id, e);
        }
        let Some(sig) = self.signals.remove(&wc.wr_id) else {
            return;
        };
        if let Some(conn) = self.conns.get_mut(&sig.conn) {
            conn.window.complete(sig.covered);
            self.in_flight = self.in_flight.saturating_sub(sig.covered);
            if let Some(wid) = sig.completes {
                forget(&mut conn.writes, wid);
                if let Some(w) = self.writes.remove(&wid) {
                    self.finish(Completion {
                        cookie: w.cookie,
                        result: Ok(()),
                    });
                }
            }
        }
        self.pump(sig.conn);
    }

    /// Fails the connections whose exchange or writes are past their
    /// deadlines, stamping the deadlines of those seen for the first time;
    /// returns the next finished write.
    pub fn sweep(&mut self, now: Instant) -> Option<Completion<VerbsError>> {
        let write_timeout = self.limits.write_timeout;
        for w in self.writes.values_mut() {
            w.deadline.get_or_insert(now + write_timeout);
        }
        let mut failing = Vec::new();
        for conn in self.conns.values_mut() {
            let connecting = matches!(conn.state, ConnState::Wanted | ConnState::Requested);
            let since = *conn.since.get_or_insert(now);
            match conn.state {
                _ if connecting && now.duration_since(since) >= self.limits.connect_timeout => {
                    failing.push((
                        conn.id,
                        VerbsError::ConnectTimeout {
                            peer: conn.peer.clone(),
                            after: self.limits.connect_timeout,
                        },
                    ));
                }
                _ => {
                    let late = conn.writes.iter().any(|w| {
                        self.writes
                            .get(w)
                            .and_then(|w| w.deadline)
                            .is_some_and(|d| d <= now)
                    });
                    if late {
                        failing.push((
                            conn.id,
                            VerbsError::Timeout {
                                peer: conn.peer.clone(),
                                after: self.limits.write_timeout,
                            },
                        ));
                    }
                }
            }
        }
        for (id, e) in failing {
            self.fail_conn(id, e);
        }
        self.done.pop_front()
    }

    /// True if completions cannot raise events and writes are pending: the
    /// caller must keep polling rather than wait.
    pub fn needs_polling(&self) -> bool {
        self.arm_failed && !self.writes.is_empty()
    }

    /// The connection's state, by peer (for tests and diagnostics).
    pub fn state_of(&self, peer: &str) -> Option<ConnState> {
        self.by_peer
            .get(peer)
            .and_then(|id| self.conns.get(id))
            .map(|c| c.state)
    }

    /// Fails every write (the transport is closing).
    pub fn fail_all(&mut self, why: &str) {
        self.fail_every(|peer| VerbsError::Broken {
            peer: peer.to_owned(),
            why: why.to_owned(),
        });
    }

    /// Fails every connection, each with the error `make` gives for its
    /// peer.
    fn fail_every(&mut self, make: impl Fn(&str) -> VerbsError) {
        let all: Vec<(u32, String)> = self
            .conns
            .values()
            .map(|c| (c.id, c.peer.clone()))
            .collect();
        for (id, peer) in all {
            self.fail_conn(id, make(&peer));
        }
    }
}

/// Removes write `wid` from a connection's list (almost always its front).
fn forget(writes: &mut VecDeque<u64>, wid: u64) {
    if writes.front() == Some(&wid) {
        writes.pop_front();
    } else if let Some(i) = writes.iter().position(|&x| x == wid) {
        writes.remove(i);
    }
}

/// The rkey of the peer's region that holds `len` bytes at `addr`.
fn check_dest(peer: &str, regions: &[RegionInfo], addr: u64, len: u64) -> Result<u32, VerbsError> {
    let inside = |r: &&RegionInfo| {
        addr >= r.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= r.addr + r.len)
    };
    match regions.iter().find(inside) {
        Some(r) => Ok(r.rkey),
        None => Err(VerbsError::DestOutOfBounds {
            peer: peer.to_owned(),
            addr,
            len,
            regions: regions.len(),
        }),
    }
}

/// An RTR failure: a timeout (or unreachable network) resolving the
/// peer's address is named as the GID/route problem it usually is.
fn rtr_error(e: DeviceError, peer: &str, sgid_index: u8, remote: &QpInfo) -> VerbsError {
    if e.errno == libc::ETIMEDOUT || e.errno == libc::ENETUNREACH {
        VerbsError::RouteTimeout {
            peer: peer.to_owned(),
            sgid_index,
            dgid: gid_text(&remote.gid),
        }
    } else {
        verb(e, peer)
    }
}
