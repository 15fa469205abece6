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

use core::fmt;
use core::time::Duration;

use super::common::{
    nested_json, Graveyard, Ignored, Instant, Leg, Name, Reason, RequestId, Side, Text, Tombstone,
};
use super::ring::Ring;
#[cfg(feature = "alloc")]
use super::Limits;
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
use crate::slots::{check_manifest, Buddy, BuddyConfig, BuddyError, SlotHandle};
use crate::transport::WriteTag;
use crate::wire::{
    AllocReject, Allocated, Done, Manifest, Msg, PreallocatedSlot, Pushed, Register, SlotList,
    Staged,
};

/// An instance's settings.
#[derive(Clone, Copy, Debug)]
pub struct InstanceConfig<'a> {
    /// The role it registers as.
    pub role: &'a str,
    /// Its data-plane session id (what peers address its pool by).
    pub session_id: &'a str,
    /// Its work endpoint.
    pub work_endpoint: &'a str,
    /// The pool's base address in this process.
    pub pool_ptr: u64,
    /// The pool's shape.
    pub pool: BuddyConfig,
    /// Receive slots set aside at start: how many, of what size.
    pub prealloc: (usize, u64),
    /// Resend `transfer_register` this often until acknowledged.
    pub register_retry: Duration,
    /// Staged, waiting for `transfer_push`, before the slot is freed.
    pub staged_timeout: Duration,
    /// Slot reserved, waiting for `transfer_ready`, before it is freed.
    pub reserved_timeout: Duration,
    /// How long a slot a write may still be landing in stays out of use.
    pub quarantine: Duration,
    /// `None` where a write's completion means its bytes arrived (the data
    /// plane's `delivery_complete`). `Some(limit)` where it does not: a
    /// transfer announced ready is handed to the application only once the
    /// data plane reports its write landed ([`Instance::handle_landed`]),
    /// and is refused after `limit` (its slot quarantined first, since the
    /// bytes may still come).
    pub landing: Option<Duration>,
}

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
    /// Sender: `transfer_staged` queued or sent, waiting for the push.
    Staged { slot: SlotHandle, data_size: u64 },
    /// Sender: write of `len` bytes posted, waiting for its completion.
    Writing {
        slot: SlotHandle,
        len: u64,
        aborted: bool,
    },
    /// Receiver: slot reserved, waiting for `transfer_ready`.
    Reserved { slot: SlotHandle },
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
    /// ([`InstanceConfig::landing`]): sender and receiver both compute it
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
    },
    /// A request this instance staged will not be delivered.
    SendFailed {
        /// The request.
        id: RequestId,
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
    /// `prealloc` or `prealloc_use` storage holds fewer than the slots
    /// asked for.
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
    /// One per request in flight.
    pub requests: ManagedSlice<'s, Option<Request>>,
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
        Ok(Self {
            tree: filled(nodes, 0),
            generations: filled(gens, 0),
            requests: empty(n),
            nested: filled(n * limits.nested_per_request, 0),
            prealloc: filled(prealloc, none),
            prealloc_use: filled(prealloc, PreallocUse::FREE),
            // Per request at most a few messages and events are queued at
            // once (staged, allocated or reject, pushed, done).
            transmits: empty(4 * n + 8),
            actions: empty(n),
            events: empty(4 * n + 8),
            tombstones: filled(limits.tombstones.max(1), Tombstone::EMPTY),
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
    /// Transfers announced ready whose write was not seen to land in time
    /// (see [`InstanceConfig::landing`]).
    pub never_landed: u64,
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
    /// The settings; the names are kept above, so the machine borrows
    /// nothing but its tables.
    config: InstanceConfig<'static>,
    pool: Buddy<'s>,
    requests: ManagedSlice<'s, Option<Request>>,
    nested: ManagedSlice<'s, u8>,
    chunk: usize,
    prealloc: ManagedSlice<'s, PreallocatedSlot>,
    prealloc_use: ManagedSlice<'s, PreallocUse>,
    transmits: Ring<'s, Outgoing>,
    actions: Ring<'s, Write>,
    events: Ring<'s, InstanceEvent>,
    tombstones: Graveyard<'s>,
    registered: bool,
    /// The last answer to the registration was a refusal.
    refused: bool,
    /// A registration is to be sent (before anything else).
    register_due: bool,
    register_at: Instant,
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
        config: InstanceConfig<'_>,
        mut s: InstanceStorage<'s>,
    ) -> Result<Self, InstanceError> {
        let mut pool =
            Buddy::new(config.pool, s.tree, s.generations).map_err(InstanceError::Config)?;
        let (count, size) = config.prealloc;
        if s.prealloc.len() < count || s.prealloc_use.len() < count {
            return Err(InstanceError::PreallocStorage { needed: count });
        }
        for (i, slot) in s.prealloc.iter_mut().take(count).enumerate() {
            // Held for the instance's lifetime: the handle is not kept.
            let h = pool.allocate(size).map_err(InstanceError::Prealloc)?;
            *slot = PreallocatedSlot {
                offset: h.offset(),
                size: h.size(),
                slot_id: i as u64,
                addr: config.pool_ptr + h.offset(),
            };
        }
        let name = |t: &str| Name::new(t).map_err(|_| InstanceError::NameTooLong);
        if s.requests.len() > MAX_REQUESTS {
            return Err(InstanceError::TooManyRequests { max: MAX_REQUESTS });
        }
        let mut requests = s.requests;
        requests.iter_mut().for_each(|r| *r = None);
        s.prealloc_use
            .iter_mut()
            .for_each(|u| *u = PreallocUse::FREE);
        let chunk = s.nested.len() / requests.len().max(1);
        let me = Self {
            role: Text::new(config.role).map_err(|_| InstanceError::NameTooLong)?,
            session: name(config.session_id)?,
            endpoint: name(config.work_endpoint)?,
            pool_ptr: config.pool_ptr,
            config: InstanceConfig {
                role: "",
                session_id: "",
                work_endpoint: "",
                pool_ptr: config.pool_ptr,
                pool: config.pool,
                prealloc: config.prealloc,
                register_retry: config.register_retry,
                staged_timeout: config.staged_timeout,
                reserved_timeout: config.reserved_timeout,
                quarantine: config.quarantine,
                landing: config.landing,
            },
            pool,
            requests,
            nested: s.nested,
            chunk,
            prealloc: s.prealloc.truncated(count),
            prealloc_use: s.prealloc_use.truncated(count),
            transmits: Ring::new(s.transmits),
            actions: Ring::new(s.actions),
            events: Ring::new(s.events),
            tombstones: Graveyard::new(s.tombstones),
            registered: false,
            refused: false,
            register_due: true,
            register_at: now + config.register_retry,
            seq: 0,
            stats: InstanceStats::default(),
        };
        Ok(me)
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
        for index in 0..self.requests.len() {
            let Some(r) = self.requests[index].take() else {
                continue;
            };
            let token = Token { index, seq: r.seq };
            let kind = match r.kind {
                Kind::Staged { slot, .. } => {
                    let _ = self.pool.free(slot);
                    self.tombstone(r.id, Side::Send);
                    self.event(InstanceEvent::SendFailed { id: r.id });
                    continue;
                }
                Kind::Writing { slot, len, aborted } => {
                    if !aborted {
                        self.event(InstanceEvent::SendFailed { id: r.id });
                    }
                    Kind::Writing {
                        slot,
                        len,
                        aborted: true,
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
            self.requests[index] = Some(Request { kind, ..r });
        }
    }

    /// True once the coordinator acknowledged the registration.
    pub fn is_registered(&self) -> bool {
        self.registered
    }

    /// Where the registration stands.
    pub fn registration(&self) -> Registration {
        if self.registered {
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
        self.requests.iter().flatten().count()
    }

    /// Preallocated slots in use.
    pub fn prealloc_in_use(&self) -> usize {
        self.prealloc_use.iter().filter(|u| !u.is_free()).count()
    }

    /// The pool range (offset, size) this instance holds for request `id`,
    /// if any: a reserved, received or quarantined slot.
    pub fn slot_for(&self, id: &str) -> Option<(u64, u64)> {
        let r = self
            .requests
            .iter()
            .flatten()
            .find(|r| r.id.as_str() == id && r.kind.side() == Side::Recv)?;
        let held = match &r.kind {
            Kind::Reserved { slot } => return Some((slot.offset(), slot.size())),
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
        self.requests.iter().position(|r| {
            r.as_ref()
                .is_some_and(|r| r.kind.side() == side && r.id.eq_json(id))
        })
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
        self.requests[index] = Some(Request {
            id,
            seq,
            kind: Kind::Quarantined { held, report },
            deadline: Some(until),
            manifest_len: 0,
            scalars_len: 0,
        });
    }

    fn insert(
        &mut self,
        id: RequestId,
        kind: Kind,
        deadline: Option<Instant>,
    ) -> Result<Token, Kind> {
        let Some(index) = self.requests.iter().position(Option::is_none) else {
            return Err(kind);
        };
        // Within a token cookie's bits; 2^48 requests before a wrap.
        self.seq = (self.seq + 1) & SEQ_MASK;
        self.requests[index] = Some(Request {
            id,
            seq: self.seq,
            kind,
            deadline,
            manifest_len: 0,
            scalars_len: 0,
        });
        Ok(Token {
            index,
            seq: self.seq,
        })
    }

    fn request_mut(&mut self, t: Token) -> Option<&mut Request> {
        self.requests
            .get_mut(t.index)?
            .as_mut()
            .filter(|r| r.seq == t.seq)
    }

    /// Frees what a request held: pool slots to the allocator, preallocated
    /// slots back to the table.
    fn free_held(&mut self, held: Held) {
        match held {
            Held::Pool(h) => {
                // The handle came from this pool and is freed once.
                let _ = self.pool.free(h);
            }
            Held::Prealloc(i) => {
                if let Some(u) = self.prealloc_use.get_mut(i) {
                    *u = PreallocUse::FREE;
                }
            }
        }
    }

    // ---- sender ---------------------------------------------------------------

    /// Reserves a slot of `data_size` bytes to stage request `id` in. Fill
    /// it at the returned offset of the pool, then call
    /// [`commit`](Self::commit).
    pub fn stage(&mut self, id: &str, data_size: u64) -> Result<(Token, u64), InstanceError> {
        let id = RequestId::new(id).map_err(|_| InstanceError::BadId)?;
        if self.find(id.as_json(), Side::Send).is_some() {
            return Err(InstanceError::BadId);
        }
        if self.requests.iter().all(Option::is_some) {
            return Err(InstanceError::TableFull);
        }
        let slot = self.pool.allocate(data_size).map_err(InstanceError::Pool)?;
        let offset = slot.offset();
        match self.insert(id, Kind::Filling { slot }, None) {
            Ok(t) => Ok((t, offset)),
            Err(Kind::Filling { slot }) => {
                let _ = self.pool.free(slot);
                Err(InstanceError::TableFull)
            }
            Err(_) => Err(InstanceError::TableFull),
        }
    }

    /// Announces a filled slot to the coordinator (`transfer_staged`).
    /// `data_size` bytes from the slot's start will be written.
    pub fn commit(
        &mut self,
        now: Instant,
        token: Token,
        data_size: u64,
        manifest: &Manifest<'_>,
        scalar_fields: RawJson<'_>,
    ) -> Result<(), InstanceError> {
        let chunk = self.chunk;
        let base = token.index * chunk;
        let timeout = self.config.staged_timeout;
        let r = self
            .requests
            .get_mut(token.index)
            .and_then(Option::as_mut)
            .filter(|r| r.seq == token.seq);
        let Some(r) = r else {
            return Err(InstanceError::StaleToken);
        };
        let Kind::Filling { slot } = &r.kind else {
            return Err(InstanceError::StaleToken);
        };
        if data_size > slot.size() {
            return Err(InstanceError::Pool(BuddyError::TooLarge {
                requested: data_size,
                max_slot: slot.size(),
            }));
        }
        let Some(dst) = self.nested.get_mut(base..base + chunk) else {
            return Err(InstanceError::TooLarge);
        };
        let mut sink = Sink::new(dst);
        manifest.write_json(&mut sink, Default::default());
        let manifest_len = sink.len();
        sink.put(scalar_fields.as_str().as_bytes());
        let total = sink.len();
        if sink.finish().is_err() {
            return Err(InstanceError::TooLarge);
        }
        let Some(r) = self.requests[token.index].take() else {
            return Err(InstanceError::StaleToken);
        };
        let Kind::Filling { slot } = r.kind else {
            self.requests[token.index] = Some(r);
            return Err(InstanceError::StaleToken);
        };
        self.requests[token.index] = Some(Request {
            kind: Kind::Staged { slot, data_size },
            manifest_len,
            scalars_len: total - manifest_len,
            deadline: Some(now + timeout),
            ..r
        });
        self.stats.staged += 1;
        self.send(OutMsg::Staged {
            index: token.index,
            seq: token.seq,
        });
        Ok(())
    }

    /// Gives up a slot from [`stage`](Self::stage) that was never committed.
    pub fn unstage(&mut self, token: Token) -> Result<(), InstanceError> {
        match self
            .request_mut(token)
            .map(|r| matches!(r.kind, Kind::Filling { .. }))
        {
            Some(true) => {}
            _ => return Err(InstanceError::StaleToken),
        }
        if let Some(Request {
            kind: Kind::Filling { slot },
            ..
        }) = self.requests[token.index].take()
        {
            let _ = self.pool.free(slot);
        }
        Ok(())
    }

    /// The data plane finished (or failed) a write from [`poll_action`].
    /// A failure's text (the data plane's own error, say) goes to the
    /// coordinator in `transfer_pushed.error`, cut at [`REASON_LEN`]
    /// bytes.
    ///
    /// Returns the bytes the write carried.
    ///
    /// [`poll_action`]: Self::poll_action
    /// [`REASON_LEN`]: super::REASON_LEN
    pub fn handle_completion(
        &mut self,
        _now: Instant,
        token: Token,
        result: Result<(), &str>,
    ) -> Result<u64, Ignored> {
        let r = self.request_mut(token).ok_or(Ignored::UnknownRequest)?;
        if !matches!(r.kind, Kind::Writing { .. }) {
            return Err(Ignored::WrongState);
        }
        let Some(Request {
            id,
            kind: Kind::Writing { slot, len, aborted },
            ..
        }) = self.requests[token.index].take()
        else {
            return Err(Ignored::WrongState);
        };
        let _ = self.pool.free(slot);
        if aborted {
            // The coordinator gave up already; it wants no report.
            return Ok(len);
        }
        self.send(OutMsg::Pushed {
            id,
            error: result.err().map(Reason::truncated),
        });
        if result.is_ok() {
            self.stats.sent += 1;
            self.event(InstanceEvent::Sent { id });
        } else {
            self.event(InstanceEvent::SendFailed { id });
        }
        Ok(len)
    }

    // ---- receiver -----------------------------------------------------------------

    /// The transfer `token` names, while the application holds it.
    pub fn received(&self, token: Token) -> Option<Received<'_>> {
        let r = self
            .requests
            .get(token.index)?
            .as_ref()
            .filter(|r| r.seq == token.seq)?;
        let Kind::Delivered { held, aborted } = &r.kind else {
            return None;
        };
        let aborted = *aborted;
        let (slot_offset, slot_size) = match held {
            Held::Pool(h) => (h.offset(), h.size()),
            Held::Prealloc(i) => self.prealloc.get(*i).map(|s| (s.offset, s.size))?,
        };
        let (manifest, scalar_fields) = nested_json(
            &self.nested,
            token.index * self.chunk,
            r.manifest_len,
            r.scalars_len,
        );
        Some(Received {
            id: r.id.as_str(),
            slot_offset,
            slot_size,
            manifest: Manifest::Raw(manifest),
            scalar_fields,
            aborted,
        })
    }

    /// The application is done with a received transfer: its slot is freed
    /// and `transfer_done` (with `error`, if any, cut at
    /// [`REASON_LEN`](super::REASON_LEN) bytes) goes to the coordinator.
    pub fn release(&mut self, token: Token, error: Option<&str>) -> Result<(), InstanceError> {
        match self
            .request_mut(token)
            .map(|r| matches!(r.kind, Kind::Delivered { .. }))
        {
            Some(true) => {}
            _ => return Err(InstanceError::StaleToken),
        }
        let Some(Request {
            id,
            kind: Kind::Delivered { held, .. },
            ..
        }) = self.requests[token.index].take()
        else {
            return Err(InstanceError::StaleToken);
        };
        self.free_held(held);
        self.done(id, error.map(Reason::truncated));
        Ok(())
    }

    /// Reports `transfer_done` for `id` and tombstones it: a duplicated
    /// `transfer_ready` arriving later must not deliver the request again
    /// (its preallocated slot may hold another request's data by then).
    fn done(&mut self, id: RequestId, error: Option<Reason>) {
        self.tombstone(id, Side::Recv);
        self.send(OutMsg::Done { id, error });
    }

    // ---- messages -----------------------------------------------------------------

    /// Handles a message from the coordinator. `Err` says why it was
    /// ignored; it changed nothing.
    pub fn handle(&mut self, now: Instant, msg: &Msg<'_>) -> Result<(), Ignored> {
        let r = match msg {
            Msg::RegisterAck(m) => {
                // An ack that names no session (a seed-era coordinator's)
                // answers whoever it reached: this endpoint is ours.
                if !m.session_id.is_empty() && !self.session.eq_json(m.session_id) {
                    Err(Ignored::WrongPeer)
                } else if self.registered {
                    Err(Ignored::Duplicate)
                } else {
                    self.registered = m.accepted;
                    self.refused = !m.accepted;
                    self.event(if m.accepted {
                        InstanceEvent::Registered
                    } else {
                        InstanceEvent::Refused
                    });
                    Ok(())
                }
            }
            // A message for another session of this endpoint (a predecessor
            // that crashed) is not for us.
            Msg::Alloc(m)
                if !m.receiver_session_id.is_empty()
                    && !self.session.eq_json(m.receiver_session_id) =>
            {
                Err(Ignored::WrongPeer)
            }
            Msg::Ready(m)
                if !m.dest_session_id.is_empty() && !self.session.eq_json(m.dest_session_id) =>
            {
                Err(Ignored::WrongPeer)
            }
            Msg::Alloc(m) => self.on_alloc(now, m.request_id, m.data_size),
            Msg::Push(m) => self.on_push(
                m.request_id,
                m.dest_session_id,
                m.dest_addr,
                m.transfer_size,
            ),
            Msg::Ready(m) => self.on_ready(
                now,
                m.request_id,
                m.slot_offset,
                &m.manifest,
                m.scalar_fields,
            ),
            Msg::Abort(m) => {
                // Which side of this instance the leg is on: a coordinator
                // that does not say means whatever it holds of the request.
                if m.source_role.is_empty() {
                    let send = self.on_abort(now, m.request_id, Side::Send);
                    let recv = self.on_abort(now, m.request_id, Side::Recv);
                    send.or(recv)
                } else if self.role.eq_json(m.source_role) {
                    self.on_abort(now, m.request_id, Side::Send)
                } else {
                    self.on_abort(now, m.request_id, Side::Recv)
                }
            }
            _ => Err(Ignored::UnexpectedType),
        };
        if r.is_err() {
            self.stats.ignored += 1;
        }
        r
    }

    fn on_alloc(&mut self, now: Instant, id: JsonStr<'_>, data_size: u64) -> Result<(), Ignored> {
        if self.tombstoned(id, Side::Recv) {
            return Err(Ignored::Aborted);
        }
        if self.find(id, Side::Recv).is_some() {
            return Err(Ignored::Duplicate);
        }
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        let reject = |me: &mut Self, retryable, reason| {
            me.stats.rejected += 1;
            me.send(OutMsg::Reject {
                id: rid,
                retryable,
                reason,
            });
            Ok(())
        };
        if self.requests.iter().all(Option::is_some) {
            return reject(self, true, "instance request table full");
        }
        let slot = match self.pool.allocate(data_size) {
            Ok(s) => s,
            Err(BuddyError::OutOfSpace { .. }) => return reject(self, true, "pool full"),
            Err(_) => return reject(self, false, "size cannot fit this pool"),
        };
        let (slot_offset, slot_size) = (slot.offset(), slot.size());
        let deadline = Some(now + self.config.reserved_timeout);
        if let Err(Kind::Reserved { slot }) = self.insert(rid, Kind::Reserved { slot }, deadline) {
            let _ = self.pool.free(slot);
            return reject(self, true, "instance request table full");
        }
        self.send(OutMsg::Allocated {
            id: rid,
            slot_offset,
            slot_size,
        });
        Ok(())
    }

    fn on_push(
        &mut self,
        id: JsonStr<'_>,
        dest_session: JsonStr<'_>,
        dest_addr: u64,
        transfer_size: u64,
    ) -> Result<(), Ignored> {
        if self.tombstoned(id, Side::Send) {
            return Err(Ignored::Aborted);
        }
        let index = self.find(id, Side::Send).ok_or(Ignored::UnknownRequest)?;
        let dest_session =
            Name::from_json(dest_session).map_err(|_| Ignored::TooLong("dest_session_id"))?;
        let Some(r) = self.requests[index].take() else {
            return Err(Ignored::UnknownRequest);
        };
        let slot = match r.kind {
            Kind::Staged { slot, data_size } if data_size == transfer_size => slot,
            kind => {
                let why = match kind {
                    Kind::Writing { .. } => Ignored::Duplicate,
                    Kind::Staged { .. } => Ignored::BadField("transfer_size"),
                    _ => Ignored::WrongState,
                };
                self.requests[index] = Some(Request { kind, ..r });
                return Err(why);
            }
        };
        let write = Write {
            token: Token { index, seq: r.seq },
            id: r.id,
            local_offset: slot.offset(),
            len: transfer_size,
            dest_session,
            dest_addr,
            tag: WriteTag::of(r.id.as_str(), dest_addr),
        };
        self.requests[index] = Some(Request {
            kind: Kind::Writing {
                slot,
                len: transfer_size,
                aborted: false,
            },
            deadline: None,
            ..r
        });
        if self.actions.push(write).is_err() {
            self.stats.dropped += 1;
        }
        Ok(())
    }

    fn on_ready(
        &mut self,
        now: Instant,
        id: JsonStr<'_>,
        slot_offset: u64,
        manifest: &Manifest<'_>,
        scalars: RawJson<'_>,
    ) -> Result<(), Ignored> {
        if self.tombstoned(id, Side::Recv) {
            return Err(Ignored::Aborted);
        }
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        // Where the data is: a slot reserved for this request, or a free
        // preallocated slot (the coordinator's fast path).
        let free_prealloc = self
            .prealloc
            .iter()
            .position(|s| s.offset == slot_offset)
            .filter(|&p| self.prealloc_use[p].is_free());
        let mut found = self.find(id, Side::Recv);
        if let (Some(i), Some(_)) = (found, free_prealloc) {
            // A slot reserved by a duplicated `transfer_alloc` that the
            // coordinator never used (it took the fast path instead): no
            // write can target it, so it goes now.
            let stale = matches!(
                &self.requests[i],
                Some(Request { kind: Kind::Reserved { slot }, .. }) if slot.offset() != slot_offset
            );
            if stale {
                if let Some(Request {
                    kind: Kind::Reserved { slot },
                    ..
                }) = self.requests[i].take()
                {
                    let _ = self.pool.free(slot);
                }
                found = None;
            }
        }
        let (index, slot_size) = match found {
            Some(i) => match self.requests[i].as_ref().map(|r| &r.kind) {
                Some(Kind::Reserved { slot }) if slot.offset() == slot_offset => {
                    (Some(i), slot.size())
                }
                Some(Kind::Reserved { .. }) => return Err(Ignored::BadField("slot_offset")),
                Some(Kind::Landing { .. } | Kind::Delivered { .. }) => {
                    return Err(Ignored::Duplicate)
                }
                _ => return Err(Ignored::WrongState),
            },
            None => {
                let p = self.prealloc.iter().position(|s| s.offset == slot_offset);
                match p {
                    Some(p) if self.prealloc_use[p].is_free() => (None, self.prealloc[p].size),
                    Some(_) => return Err(Ignored::WrongState),
                    None => return Err(Ignored::UnknownRequest),
                }
            }
        };
        let total = manifest_len(manifest) + scalars.as_str().len();
        let fits = check_manifest(manifest, slot_size).is_ok() && total <= self.chunk;
        let index = match index {
            Some(i) => i,
            None => {
                let p = self
                    .prealloc
                    .iter()
                    .position(|s| s.offset == slot_offset)
                    .ok_or(Ignored::UnknownRequest)?;
                if !fits {
                    // Nothing to free: the slot is the coordinator's to give back.
                    self.refuse_prealloc(now, p, rid, "manifest does not fit the slot");
                    return Ok(());
                }
                match self.insert(
                    rid,
                    Kind::Delivered {
                        held: Held::Prealloc(p),
                        aborted: false,
                    },
                    None,
                ) {
                    Ok(t) => {
                        self.prealloc_use[p] = PreallocUse(Use::Request);
                        t.index
                    }
                    Err(_) => {
                        self.refuse_prealloc(now, p, rid, "instance request table full");
                        return Ok(());
                    }
                }
            }
        };
        let Some(r) = self.requests[index].take() else {
            return Err(Ignored::UnknownRequest);
        };
        let held = match r.kind {
            Kind::Reserved { slot } if !fits => {
                const WHY: &str = "manifest does not fit the slot";
                match self.config.landing {
                    // The write may still be landing: the slot sits out the
                    // time it may take, then the refusal goes out.
                    Some(limit) => {
                        self.tombstone(r.id, Side::Recv);
                        let until = now + limit + self.config.quarantine;
                        self.quarantine(index, (r.id, r.seq), Held::Pool(slot), until, Some(WHY));
                    }
                    // The write is done (the coordinator saw
                    // `transfer_pushed`): the slot can go at once.
                    None => {
                        let _ = self.pool.free(slot);
                        self.done(r.id, Some(Reason::truncated(WHY)));
                    }
                }
                return Ok(());
            }
            Kind::Reserved { slot } => Held::Pool(slot),
            Kind::Delivered { held, .. } => held,
            other => {
                self.requests[index] = Some(Request { kind: other, ..r });
                return Err(Ignored::WrongState);
            }
        };
        let seq = r.seq;
        // Where a completion does not mean delivery, the data plane must
        // say the bytes arrived before the application may read them.
        let (kind, deadline) = match self.config.landing {
            Some(limit) => (
                Kind::Landing {
                    held,
                    tag: WriteTag::of(r.id.as_str(), self.pool_ptr + slot_offset),
                },
                Some(now + limit),
            ),
            None => (
                Kind::Delivered {
                    held,
                    aborted: false,
                },
                None,
            ),
        };
        let landing = matches!(kind, Kind::Landing { .. });
        self.requests[index] = Some(Request {
            kind,
            deadline,
            ..r
        });
        let base = index * self.chunk;
        let mut sink = Sink::new(&mut self.nested[base..base + self.chunk]);
        manifest.write_json(&mut sink, Default::default());
        let m_len = sink.len();
        sink.put(scalars.as_str().as_bytes());
        let s_len = sink.len() - m_len;
        if let Some(r) = self.requests[index].as_mut() {
            r.manifest_len = m_len;
            r.scalars_len = s_len;
        }
        if !landing {
            self.stats.received += 1;
            self.event(InstanceEvent::Received(Token { index, seq }));
        }
        Ok(())
    }

    /// Refuses a `transfer_ready` into preallocated slot `p` that no request
    /// record holds. Where completions mean delivery the write is done and
    /// the coordinator may reuse the slot at once; elsewhere the bytes may
    /// still come, so the slot is held (without a record: the table may be
    /// full) for as long as they may take, and the refusal goes out then.
    fn refuse_prealloc(&mut self, now: Instant, p: usize, id: RequestId, why: &'static str) {
        match self.config.landing {
            Some(limit) => {
                self.tombstone(id, Side::Recv);
                self.prealloc_use[p] = PreallocUse(Use::Refused {
                    id,
                    until: now + limit + self.config.quarantine,
                    report: Some(why),
                });
            }
            None => self.done(id, Some(Reason::truncated(why))),
        }
    }

    /// The data plane reports that the write tagged `tag` has landed in
    /// this instance's pool: the transfer waiting for it is handed to the
    /// application ([`InstanceEvent::Received`]). Only where
    /// [`InstanceConfig::landing`] is set.
    pub fn handle_landed(&mut self, _now: Instant, tag: WriteTag) -> Result<(), Ignored> {
        let index = self
            .requests
            .iter()
            .position(|r| matches!(r, Some(Request { kind: Kind::Landing { tag: t, .. }, .. }) if *t == tag))
            .ok_or(Ignored::UnknownRequest)?;
        let Some(r) = self.requests[index].take() else {
            return Err(Ignored::UnknownRequest);
        };
        let Kind::Landing { held, .. } = r.kind else {
            self.requests[index] = Some(r);
            return Err(Ignored::WrongState);
        };
        let token = Token { index, seq: r.seq };
        self.requests[index] = Some(Request {
            kind: Kind::Delivered {
                held,
                aborted: false,
            },
            deadline: None,
            ..r
        });
        self.stats.received += 1;
        self.event(InstanceEvent::Received(token));
        Ok(())
    }

    /// The tags of the writes whose arrival transfers wait for (see
    /// [`handle_landed`](Self::handle_landed)).
    pub fn awaiting_landing(&self) -> impl Iterator<Item = WriteTag> + '_ {
        // Nothing ever waits where completions mean delivery: no scan.
        let gated = if self.config.landing.is_some() {
            &self.requests[..]
        } else {
            &[]
        };
        gated.iter().flatten().filter_map(|r| match r.kind {
            Kind::Landing { tag, .. } => Some(tag),
            _ => None,
        })
    }

    fn on_abort(&mut self, now: Instant, id: JsonStr<'_>, side: Side) -> Result<(), Ignored> {
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        if self.tombstoned(id, side) {
            return Err(Ignored::Duplicate);
        }
        self.tombstone(rid, side);
        self.stats.aborted += 1;
        let Some(index) = self.find(id, side) else {
            // Nothing held here (a fast-path transfer not yet ready): the
            // tombstone keeps a late `transfer_ready` out.
            return Ok(());
        };
        let Some(r) = self.requests[index].as_mut() else {
            return Ok(());
        };
        let token = Token { index, seq: r.seq };
        match &mut r.kind {
            Kind::Filling { .. } => {
                // Not announced yet; the coordinator cannot mean it.
                return Err(Ignored::WrongState);
            }
            Kind::Writing { aborted, .. } => {
                *aborted = true;
                self.event(InstanceEvent::SendFailed { id: rid });
            }
            Kind::Delivered { aborted, .. } => {
                *aborted = true;
                self.event(InstanceEvent::Aborted(token));
            }
            Kind::Landing { .. } => {
                // The bytes may still come: quarantine the slot, and say
                // when it is free again (the coordinator waits for that
                // before it reuses a preallocated slot).
                if let Some(r) = self.requests[index].take() {
                    if let Kind::Landing { held, .. } = r.kind {
                        self.quarantine(
                            index,
                            (r.id, r.seq),
                            held,
                            now + self.config.quarantine,
                            Some(NEVER_LANDED),
                        );
                    }
                }
            }
            Kind::Quarantined { .. } => {}
            Kind::Staged { .. } => {
                if let Some(Request {
                    kind: Kind::Staged { slot, .. },
                    ..
                }) = self.requests[index].take()
                {
                    let _ = self.pool.free(slot);
                }
                self.event(InstanceEvent::SendFailed { id: rid });
            }
            Kind::Reserved { .. } => {
                // A write may still land here: quarantine the slot.
                if let Some(r) = self.requests[index].take() {
                    if let Kind::Reserved { slot } = r.kind {
                        self.quarantine(
                            index,
                            (r.id, r.seq),
                            Held::Pool(slot),
                            now + self.config.quarantine,
                            None,
                        );
                    }
                }
            }
        }
        Ok(())
    }

    // ---- time -----------------------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let register = (!self.registered).then_some(self.register_at);
        let refused = self.prealloc_use.iter().filter_map(|u| match u.0 {
            Use::Refused { until, .. } => Some(until),
            _ => None,
        });
        self.requests
            .iter()
            .flatten()
            .filter_map(|r| r.deadline)
            .chain(register)
            .chain(refused)
            .min()
    }

    /// Retries registration, drops requests the coordinator went quiet
    /// about, and ends quarantines.
    pub fn handle_timeout(&mut self, now: Instant) {
        if !self.registered && self.register_at <= now {
            self.register_at = now + self.config.register_retry;
            self.register_due = true;
        }
        for p in 0..self.prealloc_use.len() {
            if let Use::Refused { id, until, report } = self.prealloc_use[p].0 {
                if until <= now {
                    self.prealloc_use[p] = PreallocUse::FREE;
                    if let Some(why) = report {
                        self.send(OutMsg::Done {
                            id,
                            error: Some(Reason::truncated(why)),
                        });
                    }
                }
            }
        }
        for i in 0..self.requests.len() {
            let due = self.requests[i]
                .as_ref()
                .is_some_and(|r| r.deadline.is_some_and(|d| d <= now));
            if !due {
                continue;
            }
            let Some(r) = self.requests[i].take() else {
                continue;
            };
            match r.kind {
                Kind::Staged { slot, .. } => {
                    let _ = self.pool.free(slot);
                    self.stats.timed_out += 1;
                    self.tombstone(r.id, Side::Send);
                    self.event(InstanceEvent::SendFailed { id: r.id });
                }
                Kind::Reserved { slot } => {
                    // Never told the outcome: a write may still come.
                    self.stats.timed_out += 1;
                    self.tombstone(r.id, Side::Recv);
                    self.quarantine(
                        i,
                        (r.id, r.seq),
                        Held::Pool(slot),
                        now + self.config.quarantine,
                        None,
                    );
                }
                Kind::Landing { held, .. } => {
                    // Announced ready, but the bytes did not arrive in time:
                    // they may still, so the slot sits out a quarantine,
                    // after which the coordinator hears of the failure.
                    self.stats.never_landed += 1;
                    self.tombstone(r.id, Side::Recv);
                    self.quarantine(
                        i,
                        (r.id, r.seq),
                        held,
                        now + self.config.quarantine,
                        Some(NEVER_LANDED),
                    );
                }
                Kind::Quarantined { held, report } => {
                    self.free_held(held);
                    if let Some(why) = report {
                        self.send(OutMsg::Done {
                            id: r.id,
                            error: Some(Reason::truncated(why)),
                        });
                    }
                }
                other => {
                    // No deadline is set in other states; keep the record.
                    self.requests[i] = Some(Request {
                        kind: other,
                        deadline: None,
                        ..r
                    });
                }
            }
        }
    }

    // ---- output -----------------------------------------------------------------------

    /// The next write to post.
    pub fn poll_action(&mut self) -> Option<Write> {
        self.actions.pop()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<InstanceEvent> {
        self.events.pop()
    }

    /// The next message for the coordinator, encoded into `buf`; one that
    /// does not fit stays queued and its size is returned.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Result<usize, BufferTooSmall>> {
        // A registration offers every preallocated slot as free: it waits
        // until the application has let go of those it still holds (after
        // `reregister`), or a new coordinator would write into them.
        if self.register_due && self.prealloc_in_use() == 0 {
            let mut sink = Sink::new(buf);
            Msg::Register(Register {
                role: self.role.as_json(),
                session_id: self.session.as_json(),
                pool_ptr: self.pool_ptr,
                pool_size: self.config.pool.pool_size,
                work_endpoint: self.endpoint.as_json(),
                preallocated_slots: SlotList::Slots(&self.prealloc),
            })
            .write(&mut sink, Default::default());
            let r = sink.finish();
            if r.is_ok() {
                self.register_due = false;
            }
            return Some(r);
        }
        if !self.registered {
            // Nothing is announced to a coordinator that does not know us.
            return None;
        }
        loop {
            let Outgoing(m) = *self.transmits.front()?;
            let mut sink = Sink::new(buf);
            match m {
                OutMsg::Staged { index, seq } => {
                    let Some(r) = self
                        .requests
                        .get(index)
                        .and_then(Option::as_ref)
                        .filter(|r| r.seq == seq)
                    else {
                        self.transmits.pop();
                        continue;
                    };
                    let (slot_offset, data_size) = match &r.kind {
                        Kind::Staged { slot, data_size } => (slot.offset(), *data_size),
                        _ => {
                            self.transmits.pop();
                            continue;
                        }
                    };
                    let (manifest, scalar_fields) = nested_json(
                        &self.nested,
                        index * self.chunk,
                        r.manifest_len,
                        r.scalars_len,
                    );
                    Msg::Staged(Staged {
                        request_id: r.id.as_json(),
                        data_size,
                        manifest: Manifest::Raw(manifest),
                        session_id: self.session.as_json(),
                        pool_ptr: self.pool_ptr,
                        slot_offset,
                        scalar_fields,
                    })
                    .write(&mut sink, Default::default())
                }
                OutMsg::Allocated {
                    id,
                    slot_offset,
                    slot_size,
                } => Msg::Allocated(Allocated {
                    request_id: id.as_json(),
                    session_id: self.session.as_json(),
                    pool_ptr: self.pool_ptr,
                    slot_offset,
                    slot_size,
                })
                .write(&mut sink, Default::default()),
                OutMsg::Reject {
                    id,
                    retryable,
                    reason,
                } => Msg::AllocReject(AllocReject {
                    request_id: id.as_json(),
                    session_id: self.session.as_json(),
                    retryable,
                    reason: JsonStr::plain(reason),
                })
                .write(&mut sink, Default::default()),
                OutMsg::Pushed { id, error } => Msg::Pushed(Pushed {
                    request_id: id.as_json(),
                    success: error.is_none(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                })
                .write(&mut sink, Default::default()),
                OutMsg::Done { id, error } => Msg::Done(Done {
                    request_id: id.as_json(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                })
                .write(&mut sink, Default::default()),
            }
            return Some(match sink.finish() {
                Ok(n) => {
                    self.transmits.pop();
                    Ok(n)
                }
                Err(e) => Err(e),
            });
        }
    }
}

/// Bytes `manifest` takes as JSON.
fn manifest_len(m: &Manifest<'_>) -> usize {
    let mut sink = Sink::new(&mut []);
    m.write_json(&mut sink, Default::default());
    sink.len()
}
