//! The transport's bookkeeping: connections (one RC queue pair per peer
//! session this transport writes to or reads from), the queue pairs it
//! accepted from peers, the transfers (RDMA WRITEs and READs) in flight
//! and their completions.
//!
//! Everything here runs under the transport's lock and never blocks: the
//! side channel's thread feeds it exchange messages, the caller's thread
//! posts transfers and polls completions. A connection walks
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
//! and a removed connection completes every transfer it held that had not
//! completed, with an error; the next transfer with that peer starts a new
//! one. Reads and writes share it all: one queue, one window, one
//! deadline, one ending.
//! A completion is final: a connection whose queue pair ran work is
//! removed only once that work has ended. Its queue pair goes to the error
//! state, which stops it and flushes what it holds, and a marker posted
//! after that completes after every work request before it; until then it
//! is ending, known by no peer's name. Should the marker not come, the
//! queue pair is destroyed (`ibv_destroy_qp` returns once the device has
//! let go of it), the last resort.
//!
//! Modules: the connections' set-up on both sides of the exchange
//! (`connect`), transfers going out (`post`), completions and deadlines
//! (`complete`), ending connections (`end`), the queue pairs accepted
//! from writers, each kept under who asked for it (`inbound`), and the
//! hasher of the book's maps (`id_hash`).

mod complete;
mod connect;
mod end;
mod id_hash;
mod inbound;
mod post;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{Completion, Regions};

use crate::chunk::Window;
use crate::device::{Device, DeviceError, Keys, RdmaOp, RdmaWr, Wc};
use crate::error::VerbsError;
use crate::exchange::{QpInfo, RegionInfo};
use crate::session::Session;
use id_hash::IdHash;
use inbound::Inbound;
pub use inbound::Requester;

/// Completions polled per call.
const POLL_BATCH: usize = 64;

/// How long an ending connection's marker may take to complete before
/// its queue pair is destroyed instead. A NIC flushes a queue pair in
/// error within microseconds; this bounds a device that stopped working.
pub const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// The limits the connection book keeps to (named apart from tensorferry-core's
/// `handshake::Limits`, which sizes the protocol machines).
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// Outstanding work requests per queue pair (its send queue holds one
    /// more, for the marker that ends it).
    pub send_depth: u32,
    /// Largest work request.
    pub max_chunk: u32,
    /// A transfer (write or read) not completed after this fails.
    pub write_timeout: Duration,
    /// An exchange not answered after this fails the connection.
    pub connect_timeout: Duration,
    /// Accepted queue pairs kept at most, of every requester together
    /// (one per writer session and requester). A target cannot tell a
    /// writer that died from one that is idle (nothing reaches it either
    /// way), so beyond this one is destroyed: the oldest of the requester
    /// holding the most. A writer still using it sees its next write fail
    /// and reconnects. (A writer keeps at most as many connections of its
    /// own.)
    pub max_writers: usize,
    /// Accepted queue pairs kept at most for one requester (one CURVE key,
    /// or without CURVE one address): beyond this its own oldest is
    /// destroyed, so that requests from one peer never cost another its
    /// queue pairs.
    pub max_per_writer: usize,
}

/// Where a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    /// Created by a transfer; the side channel has not sent the request
    /// yet.
    Wanted,
    /// The request is out.
    Requested,
    /// Connected: transfers are posted.
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
    /// The book's tick at its last transfer (orders idle connections).
    last_used: u64,
    qp: Option<Q>,
    local: Option<QpInfo>,
    /// The peer's registered regions, as its reply listed them.
    regions: Option<Vec<RegionInfo>>,
    /// RDMA READs outstanding at most (the queue pair's `max_rd_atomic`,
    /// set once ready; 0: it cannot read).
    read_depth: u8,
    /// A READ was posted since the last fenced work request: the next
    /// WRITE carries `IBV_SEND_FENCE`.
    read_unfenced: bool,
    window: Window,
    next_seq: u32,
    /// Transfers not yet fully posted, oldest first.
    queue: VecDeque<u64>,
    /// Every transfer of this connection not yet completed, oldest first
    /// (RC completes in order, so the one that completes is the front).
    transfers: VecDeque<u64>,
    /// Work was posted to its queue pair (or a post was tried, which may
    /// have posted some): ending it needs the marker.
    posted: bool,
    /// Set once it is ending.
    ending: Option<Ending>,
}

/// A connection being ended: its queue pair is in error, and its
/// transfers are completed once the marker posted after that completes.
struct Ending {
    /// What its unfinished transfers complete with.
    outcome: Outcome,
    /// The marker's work-request id, once posted (it waits for room in
    /// the CQ).
    marker: Option<u64>,
    /// When a sweep first saw it ending (its flush deadline counts from
    /// there).
    since: Option<Instant>,
}

/// What the unfinished transfers of a connection that ends complete with.
enum Outcome {
    /// Their caller gave up on them (`Transport::cancel_transfers`).
    Cancelled,
    /// The connection failed: the first with this error, the others as
    /// abandoned because of it.
    Failed(VerbsError),
}

/// A write (local source, remote destination) or a read (remote source,
/// local destination).
struct Transfer {
    op: RdmaOp,
    cookie: u64,
    local_addr: u64,
    /// The local region's lkey.
    lkey: u32,
    /// The rkey of the peer's region (found when the first chunk goes).
    rkey: u32,
    remote_addr: u64,
    len: u64,
    posted: u64,
    /// Stamped by the first sweep after the transfer was posted.
    deadline: Option<Instant>,
}

struct Signal {
    conn: u32,
    covered: u32,
    completes: Option<u64>,
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

/// The transport's state: its connections (one per peer it writes to or
/// reads from), the queue pairs it accepted from peers, the transfers in
/// flight and their completions, and its registered regions.
pub struct ConnBook<D: Device> {
    // Queue pairs go before the device (and its registration) on drop.
    conns: HashMap<u32, Conn<D::Qp>, IdHash>,
    /// The queue pairs accepted from writers, by requester and writer
    /// session.
    inbound: Inbound<D::Qp>,
    /// Requests refused because their `from` named a session whose key is
    /// not the one their connection authenticated with.
    forged: u64,
    /// The device.
    pub device: D,
    by_peer: HashMap<String, u32>,
    transfers: HashMap<u64, Transfer, IdHash>,
    signals: HashMap<u64, Signal, IdHash>,
    done: VecDeque<Completion<VerbsError>>,
    wcs: Vec<Wc>,
    /// Scratch for the work requests of one post.
    wrs: Vec<RdmaWr>,
    next_conn: u32,
    next_transfer: u64,
    tick: u64,
    /// Work requests outstanding on every queue pair together: kept
    /// within the CQ's capacity, since a CQ that overflows goes to error.
    in_flight: u32,
    cq_capacity: u32,
    /// A pump (or a marker) stopped at the CQ's capacity: pump every
    /// connection once completions make room.
    cq_blocked: bool,
    /// Ending connections whose marker waits for room in the CQ; that
    /// room is theirs before any transfer's.
    markers_waiting: u32,
    arm_failed: bool,
    /// Transfers finished since [`ConnBook::take_news`] last looked.
    news: bool,
    psn_seed: u64,
    /// The registered regions.
    pub regions: Regions<Keys>,
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
            inbound: Inbound::default(),
            forged: 0,
            device,
            by_peer: HashMap::new(),
            transfers: HashMap::default(),
            signals: HashMap::default(),
            done: VecDeque::new(),
            wcs: Vec::with_capacity(POLL_BATCH),
            wrs: Vec::new(),
            next_conn: 1,
            next_transfer: 1,
            tick: 0,
            in_flight: 0,
            cq_capacity,
            cq_blocked: false,
            markers_waiting: 0,
            arm_failed: false,
            news: false,
            psn_seed: incarnation,
            regions: Regions::new(crate::exchange::MAX_REGIONS),
            me,
            incarnation,
            generation: 0,
            gid,
            limits,
        }
    }
}

/// The kind of a connection's oldest unfinished transfer, which its
/// failure fails first.
fn front_op(list: &VecDeque<u64>, transfers: &HashMap<u64, Transfer, IdHash>) -> RdmaOp {
    list.front()
        .and_then(|id| transfers.get(id))
        .map_or(RdmaOp::Write, |t| t.op)
}

/// Removes transfer `id` from a connection's list (almost always its
/// front).
fn forget(transfers: &mut VecDeque<u64>, id: u64) {
    if transfers.front() == Some(&id) {
        transfers.pop_front();
    } else if let Some(i) = transfers.iter().position(|&x| x == id) {
        transfers.remove(i);
    }
}
