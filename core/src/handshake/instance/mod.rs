//! An instance: the sender side (stage a request in a pool slot, write it
//! where the coordinator says, report) and the receiver side (reserve a slot
//! or reject, validate `transfer_ready`, hand the tensors to the
//! application, report `transfer_done` when it lets go).
//!
//! Every slot is freed exactly once, whatever arrives: on completion, on
//! release, on `transfer_abort`, or on a local timeout when the coordinator
//! went quiet. A slot that a write may still be landing in (reserved for a
//! transfer that was then aborted) is quarantined before reuse. Aborted
//! requests leave a tombstone so that late messages about them are ignored.
//!
//! Every per-message operation is O(1) expected (O(log n) where time
//! moves): requests, tombstones, preallocated slots, writes awaiting their
//! arrival and arrivals awaiting their ready are found through keyed hash
//! indexes, deadlines wait in heaps, and held allocations in a queue.

use core::fmt;
use core::time::Duration;

use super::common::{
    nested_json, Graveyard, Ignored, Instant, Leg, Name, Reason, RequestId, Side, Text, Tombstone,
};
use super::ring::Ring;
use super::tables::heap::{HeapEntry, Heaps};
use super::tables::index::Index;
use super::tables::table::{Record, Table};
use super::tables::{HashKey, TableSizes, TableStorage};
#[cfg(feature = "alloc")]
use super::Limits;
use super::ID_LEN;
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
#[cfg(feature = "alloc")]
use crate::slots::BuddyConfig;
use crate::slots::{check_manifest, Buddy, BuddyError, PoolRange, SlotHandle};
use crate::transport::{Landed, WriteTag};
use crate::wire::{
    AllocReject, Allocated, Deregister, Done, Manifest, Msg, PreallocatedSlot, Pushed, Register,
    SlotList, Staged,
};

mod aborts;
mod api;
pub use api::{
    InstanceError, InstanceEvent, InstanceStats, Received, Registration, SendTiming, Write,
};
mod config;
pub use config::{Head, InstanceConfig, InstanceIdentity, Prealloc, SGLANG_HEAD_TIMEOUT};
mod forward;
mod incoming;
pub use incoming::InstanceUnhandled;
mod landing;
mod leave;
pub use landing::Arrival;
use landing::Arrivals;
mod messages;
mod output;
mod receiver;
mod records;
mod registration;
mod sender;
mod storage;
pub use storage::{InstanceSizes, InstanceStorage};
mod time;

/// Where a received transfer's bytes are.
#[derive(Debug)]
enum Held {
    Pool(SlotHandle),
    Prealloc(usize),
}

#[derive(Debug)]
enum Kind {
    /// Sender: slot allocated, the application is filling it.
    Filling { slot: SlotHandle },
    /// Sender: `transfer_staged` queued or sent (at `since`), waiting for
    /// the push.
    Staged {
        slot: SlotHandle,
        data_size: u64,
        since: Instant,
    },
    /// Sender: write of `len` bytes posted (at `posted`, staged at
    /// `staged`), waiting for its completion.
    Writing {
        slot: SlotHandle,
        len: u64,
        aborted: bool,
        staged: Instant,
        posted: Instant,
    },
    /// Receiver: slot reserved, waiting for `transfer_ready`.
    Reserved { slot: SlotHandle },
    /// Receiver under [`Head::Sglang`]: a `transfer_alloc` of `data_size`
    /// bytes that found no room, retried as room frees until its deadline.
    AllocHeld { data_size: u64 },
    /// Receiver: announced ready, waiting for the data plane to report
    /// that the write tagged `tag` landed.
    Landing { held: Held, tag: WriteTag },
    /// Receiver: the application holds the data.
    Delivered { held: Held, aborted: bool },
    /// A slot out of use until a possible late write has landed; `report`:
    /// then tell the coordinator the transfer failed, and why, which is when
    /// it may reuse a preallocated slot.
    Quarantined {
        held: Held,
        report: Option<&'static str>,
    },
}

impl Kind {
    fn side(&self) -> Side {
        match self {
            Self::Filling { .. } | Self::Staged { .. } | Self::Writing { .. } => Side::Send,
            Self::Reserved { .. }
            | Self::AllocHeld { .. }
            | Self::Landing { .. }
            | Self::Delivered { .. }
            | Self::Quarantined { .. } => Side::Recv,
        }
    }
}

/// One request this instance is part of.
#[derive(Debug)]
pub struct Request {
    id: RequestId,
    seq: u64,
    kind: Kind,
    deadline: Option<Instant>,
    manifest_len: usize,
    scalars_len: usize,
}

/// What the instance's indexes hash: a request id, a tag's low bits, a
/// preallocated slot's offset.
const NS_ID: u64 = 0;
const NS_TAG: u64 = 1;
const NS_NARROW: u64 = 2;
const NS_OFFSET: u64 = 3;

/// The classes requests are counted by.
const CLASS_OTHER: usize = 0;
/// A slot reserved, or a `transfer_alloc` held, for an allocation.
const CLASS_BY_ALLOC: usize = 1;
/// Waiting for its write to land.
const CLASS_LANDING: usize = 2;
/// A slot sitting out a quarantine.
const CLASS_QUARANTINED: usize = 3;
/// A write posted, its completion not in yet.
const CLASS_WRITING: usize = 4;

impl Record for Request {
    fn key_hash(&self, key: &HashKey) -> u64 {
        key.bytes(self.id.as_bytes(), NS_ID)
    }

    fn due(&self) -> Option<Instant> {
        self.deadline
    }

    fn class(&self) -> usize {
        match self.kind {
            Kind::Reserved { .. } | Kind::AllocHeld { .. } => CLASS_BY_ALLOC,
            Kind::Landing { .. } => CLASS_LANDING,
            Kind::Quarantined { .. } => CLASS_QUARANTINED,
            Kind::Writing { .. } => CLASS_WRITING,
            _ => CLASS_OTHER,
        }
    }
}

/// The hash a write's tag is indexed by, from its low 16 bits (`None`:
/// fewer are known); never 0.
fn tag_hash(key: &HashKey, low16: Option<u64>) -> u64 {
    match low16 {
        Some(bits) => key.number(bits, NS_TAG) | 1,
        None => key.number(0, NS_NARROW) | 1,
    }
}

/// Names a request to the application; stale tokens are refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token {
    index: usize,
    seq: u64,
}

/// What holds a preallocated receive slot: one per slot, in caller storage
/// ([`InstanceStorage::prealloc_use`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct PreallocUse(Use);

#[derive(Clone, Copy, Debug, Default)]
enum Use {
    #[default]
    Free,
    /// A request record (delivered, landing or quarantined).
    Request,
    /// A transfer refused on a data plane whose completions do not mean
    /// delivery, without a request record to hold it (the table was full):
    /// its bytes may still land, so the slot sits out until `until`, then
    /// the refusal goes to the coordinator (if `report` says why).
    Refused {
        id: RequestId,
        until: Instant,
        report: Option<&'static str>,
    },
}

impl PreallocUse {
    /// Free.
    pub const FREE: Self = Self(Use::Free);

    fn is_free(&self) -> bool {
        matches!(self.0, Use::Free)
    }
}

/// The reason a transfer whose write never landed is refused with.
const NEVER_LANDED: &str = "write never landed";

/// Bits of a [`Token`]'s sequence number in its cookie; the rest hold its
/// table index, so an instance holds at most [`MAX_REQUESTS`] requests.
const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The most requests one instance's table may hold (a token's index must
/// fit its cookie).
pub const MAX_REQUESTS: usize = 1 << (64 - SEQ_BITS);

impl Token {
    /// The token as a data plane's write cookie: pass it to the data plane
    /// with the write and back with its completion ([`Token::from_cookie`]),
    /// so that the caller keeps no table of its own.
    pub const fn cookie(self) -> u64 {
        ((self.index as u64) << SEQ_BITS) | (self.seq & SEQ_MASK)
    }

    /// The token a cookie was made from. A cookie of no live request (a
    /// completion that arrives after its request ended) gives a token the
    /// instance refuses as stale.
    pub const fn from_cookie(cookie: u64) -> Self {
        Self {
            index: (cookie >> SEQ_BITS) as usize,
            seq: cookie & SEQ_MASK,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum OutMsg {
    Staged {
        index: usize,
        seq: u64,
    },
    Allocated {
        id: RequestId,
        slot_offset: u64,
        slot_size: u64,
    },
    Reject {
        id: RequestId,
        retryable: bool,
        reason: &'static str,
    },
    Pushed {
        id: RequestId,
        error: Option<Reason>,
    },
    Done {
        id: RequestId,
        error: Option<Reason>,
    },
    /// The receive side of the request at `index` is done and its next leg
    /// is staged: sglang's `transfer_done{staged_for_decoder}`.
    Forward {
        index: usize,
        seq: u64,
    },
    /// `transfer_deregister`: draining, or gone.
    Deregister {
        draining: bool,
        reason: Reason,
    },
}

/// A queued message.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing(OutMsg);

/// The instance's state machine.
pub struct Instance<'s> {
    role: Text<64>,
    session: Name,
    endpoint: Name,
    coordinator: Name,
    pool_ptr: u64,
    pool_size: u64,
    /// Its data plane's write lifetime in milliseconds, as its
    /// registration tells ferry's coordinator.
    write_lifetime_ms: u64,
    config: InstanceConfig,
    /// How long a transfer announced ready waits for its write's arrival
    /// (`None`: the data plane's completions mean delivery).
    landing: Option<Duration>,
    pool: Buddy<'s>,
    requests: Table<'s, Request>,
    nested: ManagedSlice<'s, u8>,
    chunk: usize,
    prealloc: ManagedSlice<'s, PreallocatedSlot>,
    prealloc_use: ManagedSlice<'s, PreallocUse>,
    /// The preallocated slots by offset.
    prealloc_index: Index<'s>,
    /// When each slot held for a refusal is let go.
    prealloc_timers: Heaps<'s>,
    /// Preallocated slots not free.
    prealloc_busy: usize,
    transmits: Ring<'s, Outgoing>,
    actions: Ring<'s, Write>,
    events: Ring<'s, InstanceEvent>,
    tombstones: Graveyard<'s>,
    arrivals: Arrivals<'s>,
    /// Requests awaiting their write's arrival, by tag; `landing_hashes`
    /// says what each place is indexed under (0: nothing).
    landing_index: Index<'s>,
    landing_hashes: ManagedSlice<'s, u64>,
    /// A request could not be indexed there (more than the probe bound
    /// await writes whose tags share their low 16 bits, which a sender
    /// choosing ids could arrange): arrivals are looked for by reading the
    /// table until no request awaits one.
    landing_scan: bool,
    /// `transfer_alloc`s held for room, oldest first (entries whose
    /// request moved on are skipped).
    held: Ring<'s, Token>,
    registered: bool,
    /// It takes no new work ([`Instance::drain`]).
    draining: bool,
    /// ferry's coordinator said nothing is addressed to it any more.
    drain_acked: bool,
    /// It leaves ([`Instance::leave`]), for this reason: it waits for the
    /// completions of the writes it posted, then says it is gone.
    leaving: Option<Reason>,
    /// It left: terminal; nothing more is sent.
    left: bool,
    /// A registration went out (answered or not).
    register_sent: bool,
    /// Registrations sent to this coordinator and not answered yet: an
    /// ack beyond the first answers one this instance resent, and is
    /// expected, not a duplicate to count.
    acks_owed: u32,
    /// Left while a registration went out unanswered: the coordinator
    /// may have taken it, so it hears of the leaving too.
    farewell: Option<Reason>,
    /// The last answer to the registration was a refusal.
    refused: bool,
    /// Its reason, as the coordinator gave it (empty if it gave none).
    refusal: Reason,
    /// A registration is to be sent (before anything else).
    register_due: bool,
    register_at: Instant,
    /// Which conversation with a coordinator this is: it moves on each
    /// time the instance registers anew ([`Instance::conversation`]).
    conversation: u64,
    /// The latest time a call passed in (for the calls that take none).
    last_now: Instant,
    seq: u64,
    stats: InstanceStats,
}

impl fmt::Debug for Instance<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("session", &self.session)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<'s> Instance<'s> {
    /// An instance with its pool free but for the preallocated slots, and
    /// its registration queued.
    pub fn new(
        now: Instant,
        who: &InstanceIdentity<'_>,
        config: &InstanceConfig,
        mut s: InstanceStorage<'s>,
    ) -> Result<Self, InstanceError> {
        let needed = config.quarantine_needed(who.write_lifetime);
        if config.quarantine < needed {
            return Err(InstanceError::QuarantineTooShort {
                quarantine: config.quarantine,
                needed,
            });
        }
        let mut pool = Buddy::new(config.pool(who.pool_size), s.tree, s.generations)
            .map_err(InstanceError::Config)?;
        let Prealloc { count, size } = config.prealloc;
        let timers = s.prealloc_timers.len().min(s.prealloc_timer_places.len());
        if s.prealloc.len() < count || s.prealloc_use.len() < count || timers < count {
            return Err(InstanceError::PreallocStorage { needed: count });
        }
        for (i, slot) in s.prealloc.iter_mut().take(count).enumerate() {
            // Held for the instance's lifetime: the handle is not kept.
            let h = pool.allocate(size).map_err(InstanceError::Prealloc)?;
            *slot = PreallocatedSlot {
                offset: h.offset(),
                size: h.size(),
                slot_id: i as u64,
                addr: who.pool_ptr + h.offset(),
            };
        }
        let name = |t: &str| Name::new(t).map_err(|_| InstanceError::NameTooLong);
        if s.requests.records.len() > MAX_REQUESTS {
            return Err(InstanceError::TooManyRequests { max: MAX_REQUESTS });
        }
        let key = s.hash_key;
        let requests = Table::new(s.requests, key, true);
        s.prealloc_use
            .iter_mut()
            .for_each(|u| *u = PreallocUse::FREE);
        let mut prealloc_index = Index::new(s.prealloc_index);
        for (p, slot) in s.prealloc.iter().take(count).enumerate() {
            // Offsets are distinct, and the key is the machine's own.
            if prealloc_index
                .insert(key.number(slot.offset, NS_OFFSET), p)
                .is_err()
            {
                return Err(InstanceError::PreallocStorage { needed: count });
            }
        }
        let mut landing_hashes = s.landing_hashes;
        landing_hashes.iter_mut().for_each(|h| *h = 0);
        let chunk = s.nested.len() / requests.capacity().max(1);
        let me = Self {
            role: Text::new(who.role).map_err(|_| InstanceError::NameTooLong)?,
            session: name(who.session_id)?,
            endpoint: name(who.work_endpoint)?,
            coordinator: name(who.coordinator)?,
            pool_ptr: who.pool_ptr,
            pool_size: who.pool_size,
            // Rounded up: the coordinator must not take it for shorter.
            write_lifetime_ms: u64::try_from(who.write_lifetime.as_nanos().div_ceil(1_000_000))
                .unwrap_or(u64::MAX),
            config: *config,
            // Where a completion does not mean delivery, each received
            // transfer is held until the data plane says its bytes landed.
            landing: (!who.delivery_complete).then_some(config.landing_timeout),
            pool,
            requests,
            nested: s.nested,
            chunk,
            prealloc: s.prealloc.truncated(count),
            prealloc_use: s.prealloc_use.truncated(count),
            prealloc_index,
            prealloc_timers: Heaps::new(s.prealloc_timers, s.prealloc_timer_places),
            prealloc_busy: 0,
            transmits: Ring::new(s.transmits),
            actions: Ring::new(s.actions),
            events: Ring::new(s.events),
            tombstones: Graveyard::new(s.tombstones, s.tombstones_index, key),
            arrivals: Arrivals::new(s.arrivals, key),
            landing_index: Index::new(s.landing_index),
            landing_hashes,
            landing_scan: false,
            held: Ring::new(s.held),
            registered: false,
            draining: false,
            drain_acked: false,
            leaving: None,
            left: false,
            register_sent: false,
            acks_owed: 0,
            farewell: None,
            refused: false,
            refusal: Reason::EMPTY,
            register_due: true,
            register_at: now + config.register_retry,
            conversation: 0,
            last_now: now,
            seq: 0,
            stats: InstanceStats::default(),
        };
        Ok(me)
    }

    /// Its work endpoint, where the coordinator sends to it.
    pub fn work_endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// Its data-plane session id.
    pub fn session_id(&self) -> &str {
        self.session.as_str()
    }

    /// Counters.
    pub fn stats(&self) -> &InstanceStats {
        &self.stats
    }

    /// The pool allocator (for its figures).
    pub fn pool(&self) -> &Buddy<'s> {
        &self.pool
    }

    /// Requests held (in any state, quarantined slots included).
    pub fn requests_held(&self) -> usize {
        self.requests.len()
    }

    /// Preallocated slots in use.
    pub fn prealloc_in_use(&self) -> usize {
        self.prealloc_busy
    }

    /// Places the hash indexes read so far: the lookups' work, which no
    /// choice of ids can drive past [`MAX_PROBE`](super::tables::MAX_PROBE)
    /// places per lookup.
    pub fn probes(&self) -> u64 {
        self.requests.probes()
            + self.tombstones.probes()
            + self.arrivals.probes()
            + self.landing_index.probes()
            + self.prealloc_index.probes()
    }

    /// The pool range this instance holds for request `id`, if any: a
    /// reserved, received or quarantined slot.
    pub fn slot_for(&self, id: &str) -> Option<PoolRange> {
        let hash = self.requests.key().bytes(id.as_bytes(), NS_ID);
        let i = self
            .requests
            .find(hash, |r| r.id.as_str() == id && r.kind.side() == Side::Recv)?;
        let r = self.requests.get(i)?;
        let held = match &r.kind {
            Kind::Reserved { slot } => return Some(PoolRange::new(slot.offset(), slot.size())),
            Kind::AllocHeld { .. } => return None,
            Kind::Landing { held, .. }
            | Kind::Delivered { held, .. }
            | Kind::Quarantined { held, .. } => held,
            _ => return None,
        };
        match held {
            Held::Pool(h) => Some(PoolRange::new(h.offset(), h.size())),
            Held::Prealloc(i) => self
                .prealloc
                .get(*i)
                .map(|s| PoolRange::new(s.offset, s.size)),
        }
    }

    /// The preallocated slots, as registered.
    pub fn prealloc_slots(&self) -> &[PreallocatedSlot] {
        &self.prealloc
    }
}

/// Bytes `manifest` takes as JSON.
fn manifest_len(m: &Manifest<'_>) -> usize {
    let mut sink = Sink::new(&mut []);
    m.write_json(&mut sink, Default::default());
    sink.len()
}
