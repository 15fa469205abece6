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
    nested_json, Graveyard, Ignored, Instant, Leg, Name, Reason, RequestId, Side, Text,
};
use super::ring::Ring;
use super::tables::heap::Heaps;
use super::tables::index::Index;
use super::tables::table::{Record, Table};
use super::tables::{HashKey, TableSizes, TableStorage};
use super::ID_LEN;
use super::{
    GraveyardSizes, GraveyardStorage, HeapSizes, HeapStorage, Limits, RequestsSizes,
    RequestsStorage, StorageError,
};
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
use crate::slots::{check_manifest, Buddy, BuddyConfig, BuddyError, PoolRange, SlotHandle};
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
use registration::Standing;
mod outbox;
mod sender;
use outbox::Outbox;
pub use outbox::{OutboxSizes, OutboxStorage};
mod slots;
use slots::Slots;
pub use slots::{SlotsSizes, SlotsStorage};
mod storage;
pub use storage::{InstanceSizes, InstanceStorage};
mod transfers;
use transfers::Transfers;
pub use transfers::{TransfersSizes, TransfersStorage};
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
/// ([`SlotsStorage::prealloc_use`]).
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

/// The instance's state machine: its identity and settings, and the
/// parts that own its state, each with its own storage: where it stands
/// with its coordinator (`Standing`), its pool and preallocated slots
/// (`Slots`, in [`SlotsStorage`]), the requests it is part of
/// (`Transfers`, in [`TransfersStorage`]), and what it has for its caller
/// (`Outbox`, in [`OutboxStorage`]). The machine's methods orchestrate
/// them.
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
    standing: Standing,
    slots: Slots<'s>,
    transfers: Transfers<'s>,
    outbox: Outbox<'s>,
    /// The latest time a call passed in (for the calls that take none).
    last_now: Instant,
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
        s: InstanceStorage<'s>,
    ) -> Result<Self, InstanceError> {
        let needed = config.quarantine_needed(who.write_lifetime);
        if config.quarantine < needed {
            return Err(InstanceError::QuarantineTooShort {
                quarantine: config.quarantine,
                needed,
            });
        }
        let key = s.hash_key;
        let slots = Slots::new(
            s.slots,
            config.pool(who.pool_size),
            config.prealloc,
            who.pool_ptr,
            key,
        )?;
        let name = |t: &str| Name::new(t).map_err(|_| InstanceError::NameTooLong);
        // The queues are as long as the requests in flight need.
        let limits = s.transfers.limits();
        let transfers = Transfers::new(s.transfers, key)?;
        s.outbox
            .check(&OutboxStorage::storage_needed(&limits))
            .map_err(InstanceError::Storage)?;
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
            standing: Standing::new(now + config.register_retry),
            slots,
            transfers,
            outbox: Outbox::new(s.outbox),
            last_now: now,
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
        &self.slots.pool
    }

    /// Requests held (in any state, quarantined slots included).
    pub fn requests_held(&self) -> usize {
        self.transfers.requests.len()
    }

    /// Preallocated slots in use.
    pub fn prealloc_in_use(&self) -> usize {
        self.slots.busy
    }

    /// Places the hash indexes read so far: the lookups' work, which no
    /// choice of ids can drive past [`MAX_PROBE`](super::tables::MAX_PROBE)
    /// places per lookup.
    pub fn probes(&self) -> u64 {
        self.transfers.probes() + self.slots.probes()
    }

    /// The pool range this instance holds for request `id`, if any: a
    /// reserved, received or quarantined slot.
    pub fn slot_for(&self, id: &str) -> Option<PoolRange> {
        let hash = self.transfers.requests.key().bytes(id.as_bytes(), NS_ID);
        let i = self
            .transfers
            .requests
            .find(hash, |r| r.id.as_str() == id && r.kind.side() == Side::Recv)?;
        let r = self.transfers.requests.get(i)?;
        let held = match &r.kind {
            Kind::Reserved { slot } => return Some(PoolRange::new(slot.offset(), slot.size())),
            Kind::AllocHeld { .. } => return None,
            Kind::Landing { held, .. }
            | Kind::Delivered { held, .. }
            | Kind::Quarantined { held, .. } => held,
            _ => return None,
        };
        self.slots.range(held)
    }

    /// The preallocated slots, as registered.
    pub fn prealloc_slots(&self) -> &[PreallocatedSlot] {
        &self.slots.prealloc
    }
}

/// Bytes `manifest` takes as JSON.
fn manifest_len(m: &Manifest<'_>) -> usize {
    let mut sink = Sink::new(&mut []);
    m.write_json(&mut sink, Default::default());
    sink.len()
}
