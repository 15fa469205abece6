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
use super::tables::{HashKey, TableStorage};
#[cfg(feature = "alloc")]
use super::Limits;
use super::ID_LEN;
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
#[cfg(feature = "alloc")]
use crate::slots::BuddyConfig;
use crate::slots::{check_manifest, Buddy, BuddyError, SlotHandle};
use crate::transport::{Landed, WriteTag};
use crate::wire::{
    AllocReject, Allocated, Deregister, Done, Manifest, Msg, PreallocatedSlot, Pushed, Register,
    SlotList, Staged,
};

mod aborts;
mod config;
pub use config::{Head, InstanceConfig, InstanceIdentity, Prealloc, SGLANG_HEAD_TIMEOUT};
mod forward;
mod landing;
mod leave;
pub use landing::Arrival;
use landing::Arrivals;
mod messages;
mod output;
mod receiver;
mod sender;
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

/// A write for the caller's data plane to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// Pass back to [`Instance::handle_completion`].
    pub token: Token,
    /// The request.
    pub id: RequestId,
    /// Offset of the bytes in this instance's pool.
    pub local_offset: u64,
    /// Bytes to write.
    pub len: u64,
    /// The receiver's data-plane session.
    pub dest_session: Name,
    /// Destination address in the receiver's address space.
    pub dest_addr: u64,
    /// The write's name for receivers whose data plane reports arrivals
    /// ([`InstanceIdentity::delivery_complete`] false): sender and receiver both compute it
    /// from the request id and the destination address.
    pub tag: WriteTag,
}

/// Where the instance stands with its coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Registering (at start, or again after losing the coordinator):
    /// nothing else is sent until it is acknowledged.
    Pending,
    /// The coordinator accepted it.
    Accepted,
    /// The coordinator refused it (an unknown role, say).
    Refused,
    /// Sent to a coordinator that does not answer registrations
    /// ([`Head::Sglang`]): the instance is usable.
    Sent,
}

/// How long a sent request waited and how long its write took, on the
/// instance's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendTiming {
    /// Committed (`transfer_staged` queued) to `transfer_push` received:
    /// the wait for the coordinator to find a receiver with room.
    pub queued: Duration,
    /// `transfer_push` received to the write's completion: the write.
    pub written: Duration,
}

/// What the application should know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceEvent {
    /// The coordinator accepted the registration.
    Registered,
    /// The coordinator refused the registration.
    Refused,
    /// A transfer arrived: read it with [`Instance::received`], then
    /// [`Instance::release`] it.
    Received(Token),
    /// A request this instance staged was written to its receiver.
    Sent {
        /// The request.
        id: RequestId,
        /// How long it waited, and how long its write took.
        timing: SendTiming,
    },
    /// A request this instance staged will not be delivered.
    SendFailed {
        /// The request.
        id: RequestId,
        /// Why: the coordinator's abort reason, the write's error, or the
        /// local cause (a timeout, the coordinator lost).
        reason: Reason,
    },
    /// A transfer the application holds was aborted by the coordinator;
    /// release it when done reading (its slot is freed then).
    Aborted(Token),
}

/// A received transfer, as the application reads it.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a> {
    /// The request.
    pub id: &'a str,
    /// Where the slot starts in the pool.
    pub slot_offset: u64,
    /// The slot's size (every tensor of the manifest lies inside it).
    pub slot_size: u64,
    /// Where each tensor lies in the slot (checked against its size).
    pub manifest: Manifest<'a>,
    /// Scalar fields relayed from the sender.
    pub scalar_fields: RawJson<'a>,
    /// The coordinator aborted the request since it was delivered: nobody
    /// waits for its result (releasing it still frees the slot).
    pub aborted: bool,
}

/// Why the application's call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstanceError {
    /// The pool has no room (or the size is zero or too large).
    Pool(BuddyError),
    /// The request table is full.
    TableFull,
    /// The request id is in use, or longer than [`RequestId`] holds.
    BadId,
    /// The token names no request in the state the call needs.
    StaleToken,
    /// Manifest and scalar fields exceed the storage of one request.
    TooLarge,
    /// The pool is too small for the preallocated slots asked for.
    Prealloc(BuddyError),
    /// `prealloc`, `prealloc_use` or `prealloc_timers` storage holds
    /// fewer than the slots asked for.
    PreallocStorage {
        /// Slots asked for.
        needed: usize,
    },
    /// Settings the pool cannot take.
    Config(BuddyError),
    /// A name in the settings is too long.
    NameTooLong,
    /// The request table is larger than a token can index.
    TooManyRequests {
        /// The most it may hold.
        max: usize,
    },
    /// The instance drains or has left ([`Instance::drain`]): it takes no
    /// new request.
    Draining,
}

impl fmt::Display for InstanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pool(e) => write!(f, "pool: {e}"),
            Self::TableFull => f.write_str("request table full"),
            Self::BadId => f.write_str("request id in use or too long"),
            Self::StaleToken => f.write_str("no such request in that state"),
            Self::TooLarge => f.write_str("manifest and scalar fields too large"),
            Self::Prealloc(e) => write!(f, "preallocated slots: {e}"),
            Self::PreallocStorage { needed } => {
                write!(f, "storage for {needed} preallocated slots needed")
            }
            Self::Config(e) => write!(f, "pool settings: {e}"),
            Self::NameTooLong => f.write_str("a name in the settings is too long"),
            Self::TooManyRequests { max } => {
                write!(f, "a request table holds at most {max} requests")
            }
            Self::Draining => f.write_str("the instance drains: it takes no new request"),
        }
    }
}

impl core::error::Error for InstanceError {}

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

/// Caller-owned storage of an instance.
pub struct InstanceStorage<'s> {
    /// The pool allocator's tree (see [`Buddy::storage_needed`]).
    pub tree: ManagedSlice<'s, u8>,
    /// The pool allocator's generations.
    pub generations: ManagedSlice<'s, u32>,
    /// One per request in flight, with deadlines.
    pub requests: TableStorage<'s, Request>,
    /// Manifest and scalar-field bytes, split evenly among `requests`.
    pub nested: ManagedSlice<'s, u8>,
    /// Preallocated receive slots (as many as `InstanceConfig::prealloc`).
    pub prealloc: ManagedSlice<'s, PreallocatedSlot>,
    /// Who uses each preallocated slot.
    pub prealloc_use: ManagedSlice<'s, PreallocUse>,
    /// Messages not yet polled.
    pub transmits: ManagedSlice<'s, Option<Outgoing>>,
    /// Writes not yet polled.
    pub actions: ManagedSlice<'s, Option<Write>>,
    /// Events not yet polled.
    pub events: ManagedSlice<'s, Option<InstanceEvent>>,
    /// Requests aborted or received here, newest overwriting oldest, so
    /// that late and duplicated messages about them are ignored. It should
    /// hold the requests that end within the control plane's longest delay.
    pub tombstones: ManagedSlice<'s, Tombstone>,
    /// Their index: [`TableStorage::index_places`] of `tombstones`.
    pub tombstones_index: ManagedSlice<'s, u64>,
    /// Writes that landed before their `transfer_ready` (where
    /// [`InstanceIdentity::delivery_complete`] is false): one per request in flight,
    /// with deadlines.
    pub arrivals: TableStorage<'s, Arrival>,
    /// The requests awaiting their write's arrival, by tag:
    /// [`TableStorage::index_places`] of the requests.
    pub landing_index: ManagedSlice<'s, u64>,
    /// What each request place is indexed under there: one per request.
    pub landing_hashes: ManagedSlice<'s, u64>,
    /// The preallocated slots by offset: [`TableStorage::index_places`] of
    /// `prealloc`.
    pub prealloc_index: ManagedSlice<'s, u64>,
    /// Deadlines of preallocated slots held for a refusal: one per slot.
    pub prealloc_timers: ManagedSlice<'s, HeapEntry>,
    /// Their places: one per slot.
    pub prealloc_timer_places: ManagedSlice<'s, u64>,
    /// `transfer_alloc`s held for room, oldest first: twice the requests.
    pub held: ManagedSlice<'s, Option<Token>>,
    /// The key of every index (see [`HashKey`]).
    pub hash_key: HashKey,
}

#[cfg(feature = "alloc")]
impl InstanceStorage<'static> {
    /// Tables of their own, sized by `limits` (`requests` in flight, each
    /// with `nested_per_request` bytes of nested JSON, `tombstones` ended
    /// requests), for a pool of `pool` with `prealloc` preallocated slots,
    /// and queues that are never full.
    pub fn owned(limits: &Limits, pool: &BuddyConfig, prealloc: usize) -> Result<Self, BuddyError> {
        use crate::managed::{empty, filled};
        let (nodes, gens) = Buddy::storage_needed(pool)?;
        let none = PreallocatedSlot {
            offset: 0,
            size: 0,
            slot_id: 0,
            addr: 0,
        };
        let n = limits.requests.max(1);
        let tombstones = limits.tombstones.max(1);
        Ok(Self {
            tree: filled(nodes, 0),
            generations: filled(gens, 0),
            requests: TableStorage::owned(n, true),
            nested: filled(n * limits.nested_per_request, 0),
            prealloc: filled(prealloc, none),
            prealloc_use: filled(prealloc, PreallocUse::FREE),
            // Per request at most a few messages and events are queued at
            // once (staged, allocated or reject, pushed, done).
            transmits: empty(4 * n + 8),
            actions: empty(n),
            events: empty(4 * n + 8),
            tombstones: filled(tombstones, Tombstone::EMPTY),
            tombstones_index: filled(Index::places_for(tombstones), 0),
            arrivals: TableStorage::owned(n, true),
            landing_index: filled(Index::places_for(n), 0),
            landing_hashes: filled(n, 0),
            prealloc_index: filled(Index::places_for(prealloc), 0),
            prealloc_timers: filled(prealloc, (0, 0)),
            prealloc_timer_places: filled(prealloc, 0),
            held: empty(2 * n),
            hash_key: super::tables::default_key(),
        })
    }
}

/// Counters for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceStats {
    /// Requests staged.
    pub staged: u64,
    /// Requests written to their receiver.
    pub sent: u64,
    /// Transfers received and handed to the application.
    pub received: u64,
    /// Allocations rejected.
    pub rejected: u64,
    /// Requests aborted by the coordinator.
    pub aborted: u64,
    /// Requests dropped by a local timeout.
    pub timed_out: u64,
    /// Requests forwarded (received, then staged for the next leg in one
    /// message).
    pub forwarded: u64,
    /// `transfer_alloc`s held for lack of room (under [`Head::Sglang`]).
    pub allocs_held: u64,
    /// Transfers announced ready whose write was not seen to land in time
    /// (see [`InstanceConfig::landing_timeout`]).
    pub never_landed: u64,
    /// Arrivals forgotten before their time to make room for newer ones
    /// (more writes landed ahead of their `transfer_ready` than requests
    /// fit in the table).
    pub arrivals_dropped: u64,
    /// Messages ignored.
    pub ignored: u64,
    /// Messages, actions or events that found their queue full.
    pub dropped: u64,
}

/// The instance's state machine.
pub struct Instance<'s> {
    role: Text<64>,
    session: Name,
    endpoint: Name,
    pool_ptr: u64,
    pool_size: u64,
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
            pool_ptr: who.pool_ptr,
            pool_size: who.pool_size,
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
            farewell: None,
            refused: false,
            refusal: Reason::EMPTY,
            register_due: true,
            register_at: now + config.register_retry,
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

    /// Registers again (the coordinator restarted, or the control channel
    /// reconnected): nothing else is sent until it is acknowledged.
    ///
    /// What the lost coordinator was relaying ends here: a new one knows
    /// nothing of it. Staged requests fail (their slots are freed), writes
    /// in progress will not be reported, reserved slots are quarantined (a
    /// write may still land), transfers the application holds are marked
    /// aborted, and messages still queued for the old coordinator are
    /// dropped. Requests being filled are kept. The registration goes out
    /// once the application has released every preallocated slot it holds.
    pub fn reregister(&mut self, now: Instant) {
        if self.leaving.is_some() {
            // Gone for good: nothing is announced again.
            return;
        }
        self.registered = false;
        self.refused = false;
        for u in self.prealloc_use.iter_mut() {
            if let Use::Refused { report, .. } = &mut u.0 {
                *report = None;
            }
        }
        self.register_due = true;
        self.register_at = now + self.config.register_retry;
        while self.transmits.pop().is_some() {}
        for index in 0..self.requests.capacity() {
            let Some(r) = self.requests.remove(index) else {
                continue;
            };
            let token = Token { index, seq: r.seq };
            let kind = match r.kind {
                k @ (Kind::Staged { .. } | Kind::Writing { .. }) => {
                    let lost = Reason::truncated("the coordinator was lost");
                    match self.abandon_send(r.id, k, lost) {
                        Some(k) => k,
                        None => continue,
                    }
                }
                // A write may still land in these; the old coordinator
                // wants no report.
                Kind::Reserved { slot } => {
                    self.tombstone(r.id, Side::Recv);
                    self.quarantine(
                        index,
                        (r.id, r.seq),
                        Held::Pool(slot),
                        now + self.config.quarantine,
                        None,
                    );
                    continue;
                }
                Kind::Landing { held, .. } => {
                    self.tombstone(r.id, Side::Recv);
                    self.quarantine(
                        index,
                        (r.id, r.seq),
                        held,
                        now + self.config.quarantine,
                        None,
                    );
                    continue;
                }
                // Nothing was reserved; the old coordinator's request ends.
                Kind::AllocHeld { .. } => {
                    self.tombstone(r.id, Side::Recv);
                    continue;
                }
                // A new coordinator wants no report of what the old one
                // relayed.
                Kind::Quarantined { held, .. } => Kind::Quarantined { held, report: None },
                Kind::Delivered { held, aborted } => {
                    if !aborted {
                        self.event(InstanceEvent::Aborted(token));
                    }
                    Kind::Delivered {
                        held,
                        aborted: true,
                    }
                }
                other => other,
            };
            self.requests.put(index, Request { kind, ..r });
        }
    }

    /// The send side of a request no coordinator will relay any more (it
    /// was lost, or this instance leaves), for `why`: a staged slot is
    /// freed and the request ends (`None`); a write still posted is marked
    /// aborted and kept until its completion, which then frees the slot
    /// and reports nothing. The application hears of the failure once.
    /// Other kinds come back as they are.
    fn abandon_send(&mut self, id: RequestId, kind: Kind, why: Reason) -> Option<Kind> {
        match kind {
            Kind::Staged { slot, .. } => {
                let _ = self.pool.free(slot);
                self.tombstone(id, Side::Send);
                self.event(InstanceEvent::SendFailed { id, reason: why });
                None
            }
            Kind::Writing {
                slot,
                len,
                aborted,
                staged,
                posted,
            } => {
                if !aborted {
                    self.event(InstanceEvent::SendFailed { id, reason: why });
                }
                Some(Kind::Writing {
                    slot,
                    len,
                    aborted: true,
                    staged,
                    posted,
                })
            }
            other => Some(other),
        }
    }

    /// True once the coordinator acknowledged the registration.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Why the coordinator refused the registration, as it said (empty if
    /// it said nothing, or did not refuse).
    pub fn refusal(&self) -> &str {
        self.refusal.as_str()
    }

    /// Where the registration stands.
    pub fn registration(&self) -> Registration {
        if self.registered && self.config.head == Head::Sglang {
            Registration::Sent
        } else if self.registered {
            Registration::Accepted
        } else if self.refused {
            Registration::Refused
        } else {
            Registration::Pending
        }
    }

    /// The control channel says the coordinator is gone (its connection
    /// closed, or a send to it found no peer). An instance whose
    /// registration was answered registers anew ([`reregister`]); one
    /// still registering goes on as it was, since the lost coordinator
    /// knew nothing of it.
    ///
    /// [`reregister`]: Self::reregister
    pub fn handle_coordinator_lost(&mut self, now: Instant) {
        if self.registered || self.refused {
            self.reregister(now);
        }
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

    /// The pool range (offset, size) this instance holds for request `id`,
    /// if any: a reserved, received or quarantined slot.
    pub fn slot_for(&self, id: &str) -> Option<(u64, u64)> {
        let hash = self.requests.key().bytes(id.as_bytes(), NS_ID);
        let i = self
            .requests
            .find(hash, |r| r.id.as_str() == id && r.kind.side() == Side::Recv)?;
        let r = self.requests.get(i)?;
        let held = match &r.kind {
            Kind::Reserved { slot } => return Some((slot.offset(), slot.size())),
            Kind::AllocHeld { .. } => return None,
            Kind::Landing { held, .. }
            | Kind::Delivered { held, .. }
            | Kind::Quarantined { held, .. } => held,
            _ => return None,
        };
        match held {
            Held::Pool(h) => Some((h.offset(), h.size())),
            Held::Prealloc(i) => self.prealloc.get(*i).map(|s| (s.offset, s.size)),
        }
    }

    /// The preallocated slots, as registered.
    pub fn prealloc_slots(&self) -> &[PreallocatedSlot] {
        &self.prealloc
    }

    fn send(&mut self, m: OutMsg) {
        if self.left {
            // `leave` said all there is to say.
            return;
        }
        if self.transmits.push(Outgoing(m)).is_err() {
            self.stats.dropped += 1;
        }
    }

    fn event(&mut self, e: InstanceEvent) {
        if self.events.push(e).is_err() {
            self.stats.dropped += 1;
        }
    }

    fn find(&self, id: JsonStr<'_>, side: Side) -> Option<usize> {
        let hash = self.requests.key().json::<ID_LEN>(id, NS_ID)?;
        self.requests
            .find(hash, |r| r.kind.side() == side && r.id.eq_json(id))
    }

    /// The preallocated slot at `offset`.
    fn prealloc_at(&self, offset: u64) -> Option<usize> {
        let hash = self.requests.key().number(offset, NS_OFFSET);
        self.prealloc_index.find(hash, |p| {
            self.prealloc.get(p).is_some_and(|s| s.offset == offset)
        })
    }

    /// Sets what holds preallocated slot `p`, keeping the count of slots
    /// in use and the refusals' deadlines.
    fn set_use(&mut self, p: usize, u: PreallocUse) {
        let Some(slot) = self.prealloc_use.get_mut(p) else {
            return;
        };
        let was_busy = !slot.is_free();
        *slot = u;
        self.prealloc_busy =
            (self.prealloc_busy + usize::from(!u.is_free())).saturating_sub(usize::from(was_busy));
        match u.0 {
            Use::Refused { until, .. } => self.prealloc_timers.set(0, p, until.as_nanos()),
            _ => self.prealloc_timers.remove(p),
        }
    }

    /// Indexes request `index`, now awaiting the arrival of the write
    /// tagged `tag`.
    fn await_landing(&mut self, index: usize, tag: WriteTag) {
        let hash = tag_hash(self.requests.key(), Landed::of(tag).low16());
        if self.requests.tally(CLASS_LANDING) == 0 {
            self.landing_scan = false;
        }
        if let Some(old) = self.landing_hashes.get(index).copied().filter(|&h| h != 0) {
            self.landing_index.remove(old, index);
        }
        let indexed = self.landing_index.insert(hash, index).is_ok();
        self.landing_scan |= !indexed;
        if let Some(h) = self.landing_hashes.get_mut(index) {
            *h = if indexed { hash } else { 0 };
        }
    }

    /// The request awaiting the arrival `landed` names.
    fn landing_of(&self, landed: Landed) -> Option<usize> {
        let waits =
            |r: &Request| matches!(r.kind, Kind::Landing { tag, .. } if landed.matches(tag));
        if self.requests.tally(CLASS_LANDING) == 0 {
            return None;
        }
        match landed.low16() {
            Some(_) if !self.landing_scan => {
                let hash = tag_hash(self.requests.key(), landed.low16());
                self.landing_index
                    .find(hash, |i| self.requests.get(i).is_some_and(waits))
            }
            _ => self
                .requests
                .iter()
                .position(|r| r.as_ref().is_some_and(waits)),
        }
    }

    fn tombstoned(&self, id: JsonStr<'_>, side: Side) -> bool {
        self.tombstones.contains(id, Leg::Side(side))
    }

    fn tombstone(&mut self, id: RequestId, side: Side) {
        self.tombstones.bury(id, Leg::Side(side));
    }

    /// Puts request `id` (its token's `seq`) at `index` in quarantine
    /// over `held`.
    fn quarantine(
        &mut self,
        index: usize,
        (id, seq): (RequestId, u64),
        held: Held,
        until: Instant,
        report: Option<&'static str>,
    ) {
        self.requests.put(
            index,
            Request {
                id,
                seq,
                kind: Kind::Quarantined { held, report },
                deadline: Some(until),
                manifest_len: 0,
                scalars_len: 0,
            },
        );
    }

    fn insert(
        &mut self,
        id: RequestId,
        kind: Kind,
        deadline: Option<Instant>,
    ) -> Result<Token, Kind> {
        // Within a token cookie's bits; 2^48 requests before a wrap.
        let seq = (self.seq + 1) & SEQ_MASK;
        let index = self
            .requests
            .insert(Request {
                id,
                seq,
                kind,
                deadline,
                manifest_len: 0,
                scalars_len: 0,
            })
            .map_err(|r| r.kind)?;
        self.seq = seq;
        Ok(Token { index, seq })
    }

    fn request(&self, t: Token) -> Option<&Request> {
        self.requests.get(t.index).filter(|r| r.seq == t.seq)
    }

    /// Frees what a request held: pool slots to the allocator, preallocated
    /// slots back to the table.
    fn free_held(&mut self, held: Held) {
        match held {
            Held::Pool(h) => {
                // The handle came from this pool and is freed once.
                let _ = self.pool.free(h);
            }
            Held::Prealloc(i) => self.set_use(i, PreallocUse::FREE),
        }
    }
}

/// Bytes `manifest` takes as JSON.
fn manifest_len(m: &Manifest<'_>) -> usize {
    let mut sink = Sink::new(&mut []);
    m.write_json(&mut sink, Default::default());
    sink.len()
}
