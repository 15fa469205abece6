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
//! Ready with work posted ──(completion error, post error, write timeout,
//!     cancel)──▶ ending: QP to ERR, marker posted
//! ending ──(the marker's completion)──▶ removed
//! any other ──(the same, or a refusal, a connect timeout)──▶ removed
//! ```
//!
//! and a removed connection completes every write it held that had not
//! completed, with an error; the next write to that peer starts a new one.
//! A completion is final: a connection whose queue pair ran work is
//! removed only once that work has ended. Its queue pair goes to the error
//! state, which stops it and flushes what it holds, and a marker posted
//! after that completes after every work request before it; until then it
//! is ending, known by no peer's name. Should the marker not come, the
//! queue pair is destroyed (`ibv_destroy_qp` returns once the device has
//! let go of it), the last resort.
//!
//! Modules: the connections' set-up on both sides of the exchange
//! (`connect`), writes going out (`post`), completions and deadlines
//! (`complete`), ending connections (`end`), and the hasher of the book's
//! maps (`id_hash`).

mod complete;
mod connect;
mod end;
mod id_hash;
mod post;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use ferry_core::transport::Completion;

use crate::chunk::Window;
use crate::device::{Device, DeviceError, Keys, Wc, WriteWr};
use crate::error::VerbsError;
use crate::exchange::{QpInfo, RegionInfo};
use crate::session::Session;
use id_hash::IdHash;

/// Completions polled per call.
const POLL_BATCH: usize = 64;

/// How long an ending connection's marker may take to complete before
/// its queue pair is destroyed instead. A NIC flushes a queue pair in
/// error within microseconds; this bounds a device that stopped working.
pub const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// The limits the connection book keeps to (named apart from ferry-core's
/// `handshake::Limits`, which sizes the protocol machines).
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Outstanding work requests per queue pair (its send queue holds one
    /// more, for the marker that ends it).
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
    /// Work was posted to its queue pair (or a post was tried, which may
    /// have posted some): ending it needs the marker.
    posted: bool,
    /// Set once it is ending.
    ending: Option<Ending>,
}

/// A connection being ended: its queue pair is in error, and its writes
/// are completed once the marker posted after that completes.
struct Ending {
    /// What its unfinished writes complete with.
    outcome: Outcome,
    /// The marker's work-request id, once posted (it waits for room in
    /// the CQ).
    marker: Option<u64>,
    /// When a sweep first saw it ending (its flush deadline counts from
    /// there).
    since: Option<Instant>,
}

/// What the unfinished writes of a connection that ends complete with.
enum Outcome {
    /// Their caller gave up on them (`Transport::cancel_transfers`).
    Cancelled,
    /// The connection failed: the first with this error, the others as
    /// abandoned because of it.
    Failed(VerbsError),
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
    /// A pump (or a marker) stopped at the CQ's capacity: pump every
    /// connection once completions make room.
    cq_blocked: bool,
    /// Ending connections whose marker waits for room in the CQ; that
    /// room is theirs before any write's.
    markers_waiting: u32,
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
            markers_waiting: 0,
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
}

/// Removes write `wid` from a connection's list (almost always its front).
fn forget(writes: &mut VecDeque<u64>, wid: u64) {
    if writes.front() == Some(&wid) {
        writes.pop_front();
    } else if let Some(i) = writes.iter().position(|&x| x == wid) {
        writes.remove(i);
    }
}
