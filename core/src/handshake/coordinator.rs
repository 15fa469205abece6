//! The coordinator: registry of instances by role, and one transfer record
//! per request from `transfer_staged` to `transfer_done`.
//!
//! A request moves through
//! `Queued → (fast path: Pushing | slow path: Allocating → Pushing) → Ready`
//! and ends with `transfer_done`, or fails: on a timeout in any phase, a
//! failed write, a non-retryable reject, or an instance that went away.
//! Failing sends `transfer_abort` to each instance involved and releases
//! the receiver's capacity exactly once (the ticket is consumed).
//!
//! Preallocated slots of a request that failed after its `transfer_push`
//! went out are not reused at once: a write may still be landing, or the
//! receiver may still be reading. They are parked, for `quarantine` if the
//! write was not confirmed, or until the receiver's late `transfer_done`
//! (at most `late_done_wait`) if it already held the data.

use core::fmt;
use core::time::Duration;

use super::common::{
    nested_json, Graveyard, Ignored, Instant, Leg, Name, PeerId, RequestId, Text, Tombstone,
};
use super::ring::Ring;
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
use crate::slots::{Capacity, CapacityTicket, PreallocTable};
use crate::wire::{
    Abort, Alloc, AllocReject, Allocated, Done, Manifest, Msg, Push, Pushed, Ready, Register,
    RegisterAck, Staged,
};

/// How long each wait may last before the request fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Staged, waiting for a receiver with room.
    pub queued: Duration,
    /// `transfer_alloc` sent, waiting for `transfer_allocated` or a reject.
    pub alloc: Duration,
    /// `transfer_push` sent, waiting for `transfer_pushed`. Must exceed the
    /// data plane's own write timeout plus the control plane's delay, so
    /// that no write lands after the request failed.
    pub push: Duration,
    /// `transfer_ready` sent, waiting for `transfer_done`.
    pub done: Duration,
}

/// How a receiver is chosen among the instances of the next role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// In turn, skipping instances without capacity.
    RoundRobin,
    /// The instance with the most free preallocated slots that fit, then
    /// the most free capacity.
    MostFreeSlots,
}

/// The coordinator's settings.
#[derive(Clone, Copy, Debug)]
pub struct CoordinatorConfig<'a> {
    /// Roles in hand-off order, e.g. `["encoder", "denoiser", "decoder"]`:
    /// a request staged by a role goes to the next one.
    pub pipeline: &'a [&'a str],
    /// Receiver choice.
    pub policy: Policy,
    /// Transfers an instance may receive at once.
    pub capacity_per_instance: u32,
    /// Per-phase timeouts.
    pub timeouts: Timeouts,
    /// Wait before re-dispatching after a retryable reject (times the
    /// attempt number).
    pub retry_backoff: Duration,
    /// Dispatch attempts before a request fails.
    pub max_attempts: u32,
    /// How long a preallocated slot of a request that failed mid-write
    /// stays out of use.
    pub quarantine: Duration,
    /// How long a preallocated slot of a request that failed while its
    /// receiver held the data waits for the receiver's late
    /// `transfer_done` before it is reused anyway.
    pub late_done_wait: Duration,
}

/// A registered instance.
#[derive(Debug)]
pub struct Member<const P: usize> {
    peer: PeerId,
    role: usize,
    session: Name,
    endpoint: Name,
    pool_ptr: u64,
    pool_size: u64,
    prealloc: PreallocTable<P>,
    capacity: Capacity,
    epoch: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MemberRef {
    index: usize,
    epoch: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a receiver with room; `retry_at`: after a reject's
    /// backoff. Otherwise a capacity release triggers the next attempt.
    Queued {
        retry_at: Option<Instant>,
    },
    Allocating,
    Pushing,
    Ready,
}

/// One request in flight.
#[derive(Debug)]
pub struct Transfer {
    id: RequestId,
    seq: u64,
    phase: Phase,
    deadline: Instant,
    queued_until: Instant,
    sender: MemberRef,
    /// The sender's role: with the id, it names the leg.
    sender_role: usize,
    receiver: Option<MemberRef>,
    ticket: Option<CapacityTicket>,
    prealloc: Option<u64>,
    data_size: u64,
    slot_offset: u64,
    attempts: u32,
    manifest_len: usize,
    scalars_len: usize,
    /// Which queue entry is this transfer's live one.
    queue_ticket: u64,
}

/// A place in the coordinator's wait queue.
#[derive(Clone, Copy, Debug)]
pub struct Queued {
    index: usize,
    ticket: u64,
}

/// A preallocated slot out of use after its request failed.
#[derive(Clone, Copy, Debug)]
pub struct Parked {
    member: MemberRef,
    slot_id: u64,
    id: RequestId,
    until: Instant,
    /// The receiver held the data: a late `transfer_done` ends the wait.
    held: bool,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailReason {
    /// No receiver had room within the queue timeout.
    QueueTimeout,
    /// The receiver did not answer `transfer_alloc` in time.
    AllocTimeout,
    /// The sender did not report its write in time.
    PushTimeout,
    /// The receiver did not report `transfer_done` in time.
    DoneTimeout,
    /// The receiver could not allocate, for good or too often.
    Rejected,
    /// The sender's write failed.
    WriteFailed,
    /// The receiver reported an error in `transfer_done`.
    ReceiverError,
    /// An instance involved went away or registered again.
    PeerGone,
    /// The sender's role is the last of the pipeline.
    NoNextRole,
    /// The coordinator's transfer table is full.
    TableFull,
    /// Manifest and scalar fields exceed the storage of one transfer.
    TooLarge,
    /// The receiver answered with a slot that cannot hold the data.
    BadSlot,
}

impl FailReason {
    /// The reason as sent in `transfer_abort`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::QueueTimeout => "timeout waiting for a receiver",
            Self::AllocTimeout => "timeout waiting for transfer_allocated",
            Self::PushTimeout => "timeout waiting for transfer_pushed",
            Self::DoneTimeout => "timeout waiting for transfer_done",
            Self::Rejected => "receiver rejected the allocation",
            Self::WriteFailed => "write failed",
            Self::ReceiverError => "receiver reported an error",
            Self::PeerGone => "instance went away",
            Self::NoNextRole => "no role after the sender's",
            Self::TableFull => "coordinator transfer table full",
            Self::TooLarge => "manifest and scalar fields too large",
            Self::BadSlot => "receiver's slot cannot hold the data",
        }
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the coordinator tells its application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorEvent {
    /// An instance registered (`replaced`: a previous session of the same
    /// endpoint was dropped).
    Registered {
        /// Its peer.
        peer: PeerId,
        /// Its role, as an index into the pipeline.
        role: usize,
        /// True if it replaced an earlier session.
        replaced: bool,
    },
    /// A leg of a request was received and consumed.
    Delivered {
        /// The request.
        id: RequestId,
        /// The leg: its sender's role, as an index into the pipeline.
        leg: usize,
    },
    /// A leg of a request failed; every instance involved was told.
    Failed {
        /// The request.
        id: RequestId,
        /// The leg: its sender's role, as an index into the pipeline.
        leg: usize,
        /// Why.
        reason: FailReason,
    },
}

/// A message to send.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing {
    to: PeerId,
    msg: OutMsg,
}

#[derive(Clone, Copy, Debug)]
enum OutMsg {
    Ack {
        session: Name,
        role: usize,
        accepted: bool,
        error: Option<&'static str>,
    },
    Alloc {
        id: RequestId,
        data_size: u64,
        source_role: usize,
        session: Name,
    },
    Push {
        id: RequestId,
        dest_session: Name,
        dest_addr: u64,
        transfer_size: u64,
    },
    /// Encoded from the transfer record when polled.
    Ready { index: usize, seq: u64 },
    Abort {
        id: RequestId,
        reason: &'static str,
        source_role: usize,
    },
}

/// A message for the caller to send: to whom, and its length in the buffer
/// given to [`Coordinator::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: PeerId,
    /// Payload bytes written (frame 1; frame 0 is `TRANSFER_MAGIC`).
    pub len: usize,
}

/// Counters for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Requests staged.
    pub staged: u64,
    /// Requests delivered.
    pub delivered: u64,
    /// Requests failed.
    pub failed: u64,
    /// Hand-offs that took the preallocated-slot fast path.
    pub fast_path: u64,
    /// Messages ignored.
    pub ignored: u64,
    /// Events dropped because the caller did not poll them.
    pub events_dropped: u64,
    /// Messages that could not be queued (transmit queue full).
    pub transmits_dropped: u64,
}

/// A coordinator's tables: the caller's (`(&mut table).into()` each), or
/// its own ([`owned`](Self::owned), feature `alloc`).
pub struct CoordinatorStorage<'s, const P: usize> {
    /// One per instance that may register.
    pub members: ManagedSlice<'s, Option<Member<P>>>,
    /// One per request in flight.
    pub transfers: ManagedSlice<'s, Option<Transfer>>,
    /// Manifest and scalar-field bytes, split evenly among `transfers`.
    pub nested: ManagedSlice<'s, u8>,
    /// Messages not yet polled; at least two per transfer plus one per
    /// member is never full.
    pub transmits: ManagedSlice<'s, Option<Outgoing>>,
    /// Events not yet polled.
    pub events: ManagedSlice<'s, Option<CoordinatorEvent>>,
    /// Preallocated slots out of use.
    pub parked: ManagedSlice<'s, Option<Parked>>,
    /// The order queued transfers wait in; at least twice `transfers`.
    pub queue: ManagedSlice<'s, Option<Queued>>,
    /// Legs of requests that ended, newest overwriting oldest, so that a
    /// duplicated `transfer_staged` arriving late is not taken for a new
    /// request. Request ids must not be reused while they are here.
    pub finished: ManagedSlice<'s, Tombstone>,
}

#[cfg(feature = "alloc")]
impl<const P: usize> CoordinatorStorage<'static, P> {
    /// Tables of their own, sized by `limits`: `requests` transfers (and
    /// as many bytes of nested JSON each as `nested_per_request`),
    /// `members` instances, `tombstones` ended legs, and queues that are
    /// never full.
    pub fn owned(limits: &super::Limits) -> Self {
        use crate::managed::{empty, filled};
        let n = limits.requests.max(1);
        let members = limits.members.max(1);
        Self {
            members: empty(members),
            transfers: empty(n),
            nested: filled(n * limits.nested_per_request, 0),
            // Two per transfer plus one per member is never full.
            transmits: empty(2 * n + members + 8),
            events: empty(2 * n + members + 8),
            parked: empty(n + members * P),
            queue: empty(2 * n),
            finished: filled(limits.tombstones.max(1), Tombstone::EMPTY),
        }
    }
}

/// The longest pipeline role name a coordinator keeps.
pub const ROLE_LEN: usize = 64;
/// The most roles a pipeline may have.
pub const MAX_ROLES: usize = 8;

/// The coordinator's state machine.
pub struct Coordinator<'s, const P: usize> {
    /// The settings; the pipeline is kept in `roles`, so the machine
    /// borrows nothing but its tables.
    config: CoordinatorConfig<'static>,
    roles: [Text<ROLE_LEN>; MAX_ROLES],
    role_count: usize,
    members: ManagedSlice<'s, Option<Member<P>>>,
    transfers: ManagedSlice<'s, Option<Transfer>>,
    nested: ManagedSlice<'s, u8>,
    chunk: usize,
    transmits: Ring<'s, Outgoing>,
    events: Ring<'s, CoordinatorEvent>,
    parked: ManagedSlice<'s, Option<Parked>>,
    queue: Ring<'s, Queued>,
    queue_tickets: u64,
    epochs: u32,
    finished: Graveyard<'s>,
    cursor: [usize; 8],
    seq: u64,
    stats: CoordinatorStats,
}

impl<const P: usize> fmt::Debug for Coordinator<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Bad coordinator settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The pipeline has no role, or more than 8.
    Pipeline,
    /// A pipeline role's name is longer than [`ROLE_LEN`] bytes.
    RoleTooLong,
    /// No transfer storage.
    NoTransfers,
    /// The wait queue is shorter than twice the transfer table.
    QueueTooShort,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pipeline => "the pipeline must have 1 to 8 roles",
            Self::RoleTooLong => "a pipeline role's name is longer than 64 bytes",
            Self::NoTransfers => "the transfer table is empty",
            Self::QueueTooShort => {
                "the wait queue must be at least twice as long as the transfer table"
            }
        })
    }
}

impl core::error::Error for ConfigError {}

impl<'s, const P: usize> Coordinator<'s, P> {
    /// A coordinator with no instance registered.
    pub fn new(
        config: CoordinatorConfig<'_>,
        mut storage: CoordinatorStorage<'s, P>,
    ) -> Result<Self, ConfigError> {
        if config.pipeline.is_empty() || config.pipeline.len() > MAX_ROLES {
            return Err(ConfigError::Pipeline);
        }
        let mut roles = [Text::EMPTY; MAX_ROLES];
        for (kept, role) in roles.iter_mut().zip(config.pipeline) {
            *kept = Text::new(role).map_err(|_| ConfigError::RoleTooLong)?;
        }
        if storage.transfers.is_empty() {
            return Err(ConfigError::NoTransfers);
        }
        if storage.queue.len() < 2 * storage.transfers.len() {
            return Err(ConfigError::QueueTooShort);
        }
        let chunk = storage.nested.len() / storage.transfers.len();
        storage.members.iter_mut().for_each(|m| *m = None);
        storage.transfers.iter_mut().for_each(|t| *t = None);
        storage.parked.iter_mut().for_each(|p| *p = None);
        Ok(Self {
            config: CoordinatorConfig {
                pipeline: &[],
                policy: config.policy,
                capacity_per_instance: config.capacity_per_instance,
                timeouts: config.timeouts,
                retry_backoff: config.retry_backoff,
                max_attempts: config.max_attempts,
                quarantine: config.quarantine,
                late_done_wait: config.late_done_wait,
            },
            roles,
            role_count: config.pipeline.len(),
            members: storage.members,
            transfers: storage.transfers,
            nested: storage.nested,
            chunk,
            transmits: Ring::new(storage.transmits),
            events: Ring::new(storage.events),
            parked: storage.parked,
            queue: Ring::new(storage.queue),
            queue_tickets: 0,
            epochs: 0,
            finished: Graveyard::new(storage.finished),
            cursor: [0; 8],
            seq: 0,
            stats: CoordinatorStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &CoordinatorStats {
        &self.stats
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.transfers.iter().flatten().count()
    }

    /// Registered instances.
    pub fn members(&self) -> usize {
        self.members.iter().flatten().count()
    }

    /// Capacity units in use on each registered instance, with its peer.
    pub fn capacity_in_use(&self) -> impl Iterator<Item = (PeerId, u32)> + '_ {
        self.members
            .iter()
            .flatten()
            .map(|m| (m.peer, m.capacity.in_use()))
    }

    /// Preallocated slots taken or parked, over all instances.
    pub fn prealloc_taken(&self) -> usize {
        self.members
            .iter()
            .flatten()
            .map(|m| m.prealloc.len() - m.prealloc.free())
            .sum()
    }

    /// The preallocated slot assigned (or parked) for request `id`: the
    /// receiver's peer and the slot's offset and size in its pool.
    pub fn prealloc_for(&self, id: &str) -> Option<(PeerId, u64, u64)> {
        let slot = |r: MemberRef, slot_id: u64| {
            let m = self.member(r)?;
            let (s, _) = m.prealloc.get(slot_id)?;
            Some((m.peer, s.offset, s.size))
        };
        let live = self
            .transfers
            .iter()
            .flatten()
            .find(|t| t.id.as_str() == id);
        if let Some(found) = live.and_then(|t| slot(t.receiver?, t.prealloc?)) {
            return Some(found);
        }
        self.parked
            .iter()
            .flatten()
            .filter(|p| p.id.as_str() == id)
            .find_map(|p| slot(p.member, p.slot_id))
    }

    /// Handles a message from `from`. `Err` says why it was ignored; it
    /// changed nothing.
    pub fn handle(&mut self, now: Instant, from: PeerId, msg: &Msg<'_>) -> Result<(), Ignored> {
        let r = match msg {
            Msg::Register(m) => self.on_register(now, from, m),
            Msg::Staged(m) => self.on_staged(now, from, m),
            Msg::Allocated(m) => self.on_allocated(now, from, m),
            Msg::AllocReject(m) => self.on_reject(now, from, m),
            Msg::Pushed(m) => self.on_pushed(now, from, m),
            Msg::Done(m) => self.on_done(now, from, m),
            _ => Err(Ignored::UnexpectedType),
        };
        if r.is_err() {
            self.stats.ignored += 1;
        }
        r
    }

    // ---- lookups -----------------------------------------------------------

    fn member_of_peer(&self, peer: PeerId) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| m.peer == peer))
    }

    fn member(&self, r: MemberRef) -> Option<&Member<P>> {
        self.members
            .get(r.index)?
            .as_ref()
            .filter(|m| m.epoch == r.epoch)
    }

    fn member_mut(&mut self, r: MemberRef) -> Option<&mut Member<P>> {
        self.members
            .get_mut(r.index)?
            .as_mut()
            .filter(|m| m.epoch == r.epoch)
    }

    /// The transfer of request `id` whose sender or receiver (as
    /// `from_sender` says) is `from`. One request has a transfer per leg,
    /// and an instance takes part in a leg on one side only, so at most one
    /// matches; failing that, any transfer of `id` (to say why it is not
    /// `from`'s).
    fn transfer_of(&self, id: JsonStr<'_>, from: PeerId, from_sender: bool) -> Option<usize> {
        let mut any = None;
        for (i, t) in self.transfers.iter().enumerate() {
            let Some(t) = t.as_ref().filter(|t| t.id.eq_json(id)) else {
                continue;
            };
            let who = if from_sender {
                Some(t.sender)
            } else {
                t.receiver
            };
            if who
                .and_then(|r| self.member(r))
                .is_some_and(|m| m.peer == from)
            {
                return Some(i);
            }
            any.get_or_insert(i);
        }
        any
    }

    /// The transfer `id` if it is in `phase` and `from` is its receiver (or
    /// sender, if `from_sender`).
    fn expect(
        &self,
        id: JsonStr<'_>,
        from: PeerId,
        from_sender: bool,
        phase: fn(&Phase) -> bool,
    ) -> Result<usize, Ignored> {
        let i = self
            .transfer_of(id, from, from_sender)
            .ok_or(Ignored::UnknownRequest)?;
        let t = self.transfers[i].as_ref().ok_or(Ignored::UnknownRequest)?;
        let who = if from_sender {
            Some(t.sender)
        } else {
            t.receiver
        };
        let member = who.and_then(|r| self.member(r)).ok_or(Ignored::WrongPeer)?;
        if member.peer != from {
            return Err(Ignored::WrongPeer);
        }
        if !phase(&t.phase) {
            return Err(Ignored::WrongState);
        }
        Ok(i)
    }

    // ---- output ------------------------------------------------------------

    fn send(&mut self, to: PeerId, msg: OutMsg) {
        if self.transmits.push(Outgoing { to, msg }).is_err() {
            self.stats.transmits_dropped += 1;
        }
    }

    fn event(&mut self, e: CoordinatorEvent) {
        if self.events.push(e).is_err() {
            self.stats.events_dropped += 1;
        }
    }

    /// The next message to send, encoded into `buf`. A message that does
    /// not fit stays queued and its size is returned.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Result<Transmit, BufferTooSmall>> {
        loop {
            let out = *self.transmits.front()?;
            let mut sink = Sink::new(buf);
            let encoded = match out.msg {
                OutMsg::Ready { index, seq } => {
                    let Some(t) = self
                        .transfers
                        .get(index)
                        .and_then(Option::as_ref)
                        .filter(|t| t.seq == seq)
                    else {
                        // The request ended before its READY went out.
                        self.transmits.pop();
                        continue;
                    };
                    let (manifest, scalars) = self.nested_of(index, t);
                    let session = t
                        .receiver
                        .and_then(|r| self.member(r))
                        .map(|m| m.session.as_json());
                    Msg::Ready(Ready {
                        request_id: t.id.as_json(),
                        manifest: Manifest::Raw(manifest),
                        slot_offset: t.slot_offset,
                        scalar_fields: scalars,
                        dest_session_id: session.unwrap_or_default(),
                    })
                    .write(&mut sink, Default::default());
                    true
                }
                _ => false,
            };
            if !encoded {
                self.encode_simple(&out.msg, &mut sink);
            }
            return Some(match sink.finish() {
                Ok(len) => {
                    self.transmits.pop();
                    Ok(Transmit { to: out.to, len })
                }
                Err(e) => Err(e),
            });
        }
    }

    fn encode_simple(&self, msg: &OutMsg, sink: &mut Sink<'_>) {
        let m = match msg {
            OutMsg::Ack {
                session,
                role,
                accepted,
                error,
            } => Msg::RegisterAck(RegisterAck {
                session_id: session.as_json(),
                role: JsonStr::plain(self.role_name(*role)),
                accepted: *accepted,
                error: error.map(JsonStr::plain),
            }),
            OutMsg::Alloc {
                id,
                data_size,
                source_role,
                session,
            } => Msg::Alloc(Alloc {
                request_id: id.as_json(),
                data_size: *data_size,
                source_role: JsonStr::plain(self.role_name(*source_role)),
                receiver_session_id: session.as_json(),
            }),
            OutMsg::Push {
                id,
                dest_session,
                dest_addr,
                transfer_size,
            } => Msg::Push(Push {
                request_id: id.as_json(),
                dest_session_id: dest_session.as_json(),
                dest_addr: *dest_addr,
                transfer_size: *transfer_size,
            }),
            OutMsg::Abort {
                id,
                reason,
                source_role,
            } => Msg::Abort(Abort {
                request_id: id.as_json(),
                reason: JsonStr::plain(reason),
                source_role: JsonStr::plain(self.role_name(*source_role)),
            }),
            OutMsg::Ready { .. } => return,
        };
        m.write(sink, Default::default());
    }

    /// The name of pipeline role `role` ("" if there is none).
    fn role_name(&self, role: usize) -> &str {
        self.pipeline().get(role).map_or("", Text::as_str)
    }

    /// The pipeline's roles, in hand-off order.
    fn pipeline(&self) -> &[Text<ROLE_LEN>] {
        &self.roles[..self.role_count]
    }

    fn nested_of(&self, index: usize, t: &Transfer) -> (RawJson<'_>, RawJson<'_>) {
        nested_json(
            &self.nested,
            index * self.chunk,
            t.manifest_len,
            t.scalars_len,
        )
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CoordinatorEvent> {
        self.events.pop()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let transfers = self.transfers.iter().flatten().map(|t| match t.phase {
            Phase::Queued { retry_at: Some(at) } => t.deadline.min(at),
            _ => t.deadline,
        });
        let parked = self.parked.iter().flatten().map(|p| p.until);
        transfers.chain(parked).min()
    }

    // ---- registration --------------------------------------------------------

    fn on_register(&mut self, now: Instant, from: PeerId, m: &Register<'_>) -> Result<(), Ignored> {
        let session = Name::from_json(m.session_id).map_err(|_| Ignored::TooLong("session_id"))?;
        let endpoint =
            Name::from_json(m.work_endpoint).map_err(|_| Ignored::TooLong("work_endpoint"))?;
        let role = self.pipeline().iter().position(|r| r.eq_json(m.role));
        let refuse = |c: &mut Self, error: &'static str| {
            c.send(
                from,
                OutMsg::Ack {
                    session,
                    role: usize::MAX,
                    accepted: false,
                    error: Some(error),
                },
            );
            Ok(())
        };
        let Some(role) = role else {
            return refuse(self, "unknown role");
        };
        let prealloc = match PreallocTable::<P>::from_registration(
            &m.preallocated_slots,
            m.pool_ptr,
            m.pool_size,
        ) {
            Ok(t) => t,
            Err(_) => return refuse(self, "bad preallocated_slots"),
        };
        // The same endpoint (or peer) registering again.
        let existing = self.members.iter().position(|x| {
            x.as_ref()
                .is_some_and(|x| x.endpoint == endpoint || x.peer == from)
        });
        if let Some(i) = existing {
            let same = self.members[i]
                .as_ref()
                .is_some_and(|x| x.session == session && x.peer == from);
            if same {
                // A retried registration: answer again, change nothing.
                self.accept(from, session, role);
                return Err(Ignored::Duplicate);
            }
        }
        let index = match existing.or_else(|| self.members.iter().position(Option::is_none)) {
            Some(i) => i,
            None => return refuse(self, "coordinator instance table full"),
        };
        // Epochs are never reused, so no reference to an earlier member of
        // this table slot can match the new one.
        self.epochs = self.epochs.wrapping_add(1);
        let epoch = self.epochs;
        let replaced = if let Some(old) = self.members[index].as_ref() {
            let old_ref = MemberRef {
                index,
                epoch: old.epoch,
            };
            self.drop_member(now, old_ref);
            true
        } else {
            false
        };
        self.members[index] = Some(Member {
            peer: from,
            role,
            session,
            endpoint,
            pool_ptr: m.pool_ptr,
            pool_size: m.pool_size,
            prealloc,
            capacity: Capacity::new(index as u32, self.config.capacity_per_instance),
            epoch,
        });
        self.accept(from, session, role);
        self.event(CoordinatorEvent::Registered {
            peer: from,
            role,
            replaced,
        });
        self.dispatch_queued(now);
        Ok(())
    }

    /// Acknowledges a registration.
    fn accept(&mut self, to: PeerId, session: Name, role: usize) {
        let ack = OutMsg::Ack {
            session,
            role,
            accepted: true,
            error: None,
        };
        self.send(to, ack);
    }

    /// Fails every transfer involving `r`, forgets its parked slots, and
    /// removes it.
    fn drop_member(&mut self, now: Instant, r: MemberRef) {
        for i in 0..self.transfers.len() {
            let involved = self.transfers[i]
                .as_ref()
                .is_some_and(|t| t.sender == r || t.receiver == Some(r));
            if involved {
                self.fail(now, i, FailReason::PeerGone);
            }
        }
        for p in self.parked.iter_mut() {
            if p.is_some_and(|p| p.member == r) {
                *p = None;
            }
        }
        if let Some(slot) = self.members.get_mut(r.index) {
            *slot = None;
        }
    }

    /// The role (index into the pipeline) of registered peer `peer`.
    pub fn role_of(&self, peer: PeerId) -> Option<usize> {
        self.members
            .iter()
            .flatten()
            .find(|m| m.peer == peer)
            .map(|m| m.role)
    }

    /// Who sent `msg`, judged by its content, for control channels that
    /// cannot name the sender (a ZeroMQ PULL socket cannot). `role` is the
    /// sender's role if the channel knows it (sglang gives each role its
    /// own result endpoint); without it, a `transfer_done` for a request
    /// that two legs hold at once cannot be told apart.
    ///
    /// `transfer_staged`, `transfer_allocated` and `transfer_alloc_reject`
    /// name their session; `transfer_pushed` comes from the sender of the
    /// leg being written, `transfer_done` from the receiver of the leg
    /// delivered (or of a failed one whose slot waits for it).
    /// `transfer_register` has no sender yet: `None`.
    pub fn sender_of(&self, msg: &Msg<'_>, role: Option<usize>) -> Option<PeerId> {
        let by_session = |session: JsonStr<'_>| {
            self.members
                .iter()
                .flatten()
                .find(|m| m.session.eq_json(session) && role.is_none_or(|r| r == m.role))
                .map(|m| m.peer)
        };
        let leg = |id: JsonStr<'_>, phase: Phase, receiver: bool| {
            self.transfers.iter().flatten().find_map(|t| {
                if !t.id.eq_json(id) || t.phase != phase {
                    return None;
                }
                let (who, who_role) = if receiver {
                    (t.receiver?, t.sender_role + 1)
                } else {
                    (t.sender, t.sender_role)
                };
                if role.is_some_and(|r| r != who_role) {
                    return None;
                }
                self.member(who).map(|m| m.peer)
            })
        };
        match msg {
            Msg::Staged(m) => by_session(m.session_id),
            Msg::Allocated(m) => by_session(m.session_id),
            Msg::AllocReject(m) => by_session(m.session_id),
            Msg::Pushed(m) => leg(m.request_id, Phase::Pushing, false),
            Msg::Done(m) => leg(m.request_id, Phase::Ready, true).or_else(|| {
                self.parked.iter().flatten().find_map(|p| {
                    let m2 = self.member(p.member)?;
                    (p.held && p.id.eq_json(m.request_id) && role.is_none_or(|r| r == m2.role))
                        .then_some(m2.peer)
                })
            }),
            _ => None,
        }
    }

    /// The caller's transport lost `peer` for good: its instance is dropped
    /// and its transfers fail.
    pub fn peer_lost(&mut self, now: Instant, peer: PeerId) {
        if let Some(index) = self.member_of_peer(peer) {
            if let Some(epoch) = self.members[index].as_ref().map(|m| m.epoch) {
                self.drop_member(now, MemberRef { index, epoch });
            }
        }
    }

    // ---- staging and dispatch -------------------------------------------------

    fn on_staged(&mut self, now: Instant, from: PeerId, m: &Staged<'_>) -> Result<(), Ignored> {
        let id = RequestId::from_json(m.request_id).map_err(|_| Ignored::TooLong("request_id"))?;
        let sender_index = self.member_of_peer(from).ok_or(Ignored::NotRegistered)?;
        let sender = self.members[sender_index]
            .as_ref()
            .ok_or(Ignored::NotRegistered)?;
        if !sender.session.eq_json(m.session_id) {
            return Err(Ignored::WrongPeer);
        }
        let sender_ref = MemberRef {
            index: sender_index,
            epoch: sender.epoch,
        };
        let sender_role = sender.role;
        let live = self
            .transfers
            .iter()
            .flatten()
            .any(|t| t.id.eq_json(m.request_id) && t.sender_role == sender_role);
        if live
            || self
                .finished
                .contains(m.request_id, Leg::FromRole(sender_role))
        {
            return Err(Ignored::Duplicate);
        }
        self.stats.staged += 1;
        let abort = |c: &mut Self, reason: FailReason| {
            c.finished.bury(id, Leg::FromRole(sender_role));
            c.send(
                from,
                OutMsg::Abort {
                    id,
                    reason: reason.as_str(),
                    source_role: sender_role,
                },
            );
            c.stats.failed += 1;
            c.event(CoordinatorEvent::Failed {
                id,
                leg: sender_role,
                reason,
            });
            Ok(())
        };
        if sender_role + 1 >= self.role_count {
            return abort(self, FailReason::NoNextRole);
        }
        let Some(index) = self.transfers.iter().position(Option::is_none) else {
            return abort(self, FailReason::TableFull);
        };
        let manifest = match m.manifest {
            Manifest::Raw(raw) => raw.as_str(),
            // Decoded messages always carry raw manifests.
            Manifest::Entries(_) => return Err(Ignored::BadField("manifest")),
        };
        let scalars = m.scalar_fields.as_str();
        let base = index * self.chunk;
        let total = manifest.len() + scalars.len();
        let Some(dst) = self
            .nested
            .get_mut(base..base + total)
            .filter(|_| total <= self.chunk)
        else {
            return abort(self, FailReason::TooLarge);
        };
        dst[..manifest.len()].copy_from_slice(manifest.as_bytes());
        dst[manifest.len()..].copy_from_slice(scalars.as_bytes());
        self.seq += 1;
        self.transfers[index] = Some(Transfer {
            id,
            seq: self.seq,
            phase: Phase::Queued { retry_at: None },
            deadline: now + self.config.timeouts.queued,
            queued_until: now + self.config.timeouts.queued,
            sender: sender_ref,
            sender_role,
            receiver: None,
            ticket: None,
            prealloc: None,
            data_size: m.data_size,
            slot_offset: 0,
            attempts: 0,
            manifest_len: manifest.len(),
            scalars_len: scalars.len(),
            queue_ticket: 0,
        });
        self.enqueue(index);
        self.dispatch(now, index);
        Ok(())
    }

    /// Picks a receiver of the next role with capacity, by policy.
    fn choose(&mut self, role: usize, data_size: u64) -> Option<usize> {
        let n = self.members.len();
        fn candidate<const P: usize>(m: &Option<Member<P>>, role: usize) -> Option<&Member<P>> {
            m.as_ref()
                .filter(|m| m.role == role && m.capacity.available() > 0)
        }
        match self.config.policy {
            Policy::RoundRobin => {
                let start = self.cursor[role] % n.max(1);
                let i = (0..n)
                    .map(|k| (start + k) % n)
                    .find(|&i| candidate(&self.members[i], role).is_some())?;
                self.cursor[role] = i + 1;
                Some(i)
            }
            Policy::MostFreeSlots => (0..n)
                .filter_map(|i| candidate(&self.members[i], role).map(|m| (i, m)))
                .max_by_key(|(i, m)| {
                    (
                        m.prealloc.free_fitting(data_size),
                        m.capacity.available(),
                        usize::MAX - i,
                    )
                })
                .map(|(i, _)| i),
        }
    }

    /// Tries to hand transfer `index` (queued) to a receiver.
    fn dispatch(&mut self, now: Instant, index: usize) {
        let Some(t) = self.transfers[index].as_ref() else {
            return;
        };
        let Phase::Queued { retry_at } = t.phase else {
            return;
        };
        if retry_at.is_some_and(|at| at > now) {
            return;
        }
        let (data_size, id, sender) = (t.data_size, t.id, t.sender);
        let Some(role) = self.member(sender).map(|s| s.role + 1) else {
            self.fail(now, index, FailReason::PeerGone);
            return;
        };
        let Some(r) = self.choose(role, data_size) else {
            // No room anywhere: wait for a capacity release.
            if let Some(t) = self.transfers[index].as_mut() {
                t.phase = Phase::Queued { retry_at: None };
            }
            return;
        };
        let Some(m) = self.members[r].as_mut() else {
            return;
        };
        let Ok(ticket) = m.capacity.acquire() else {
            return;
        };
        let receiver = MemberRef {
            index: r,
            epoch: m.epoch,
        };
        let (peer, session) = (m.peer, m.session);
        let fast = m.prealloc.take(data_size);
        let Some(t) = self.transfers[index].as_mut() else {
            return;
        };
        t.receiver = Some(receiver);
        t.ticket = Some(ticket);
        t.attempts += 1;
        match fast {
            Some(slot) => {
                t.prealloc = Some(slot.slot_id);
                t.slot_offset = slot.offset;
                t.phase = Phase::Pushing;
                t.deadline = now + self.config.timeouts.push;
                self.stats.fast_path += 1;
                if let Some(sender_peer) = self.member(sender).map(|s| s.peer) {
                    self.send(
                        sender_peer,
                        OutMsg::Push {
                            id,
                            dest_session: session,
                            dest_addr: slot.addr,
                            transfer_size: data_size,
                        },
                    );
                }
            }
            None => {
                t.phase = Phase::Allocating;
                t.deadline = now + self.config.timeouts.alloc;
                let source_role = role - 1;
                self.send(
                    peer,
                    OutMsg::Alloc {
                        id,
                        data_size,
                        source_role,
                        session,
                    },
                );
            }
        }
    }

    /// Dispatches queued transfers, oldest first, as far as capacity goes.
    /// Puts transfer `index` at the back of the wait queue; any earlier
    /// entry of it goes stale.
    fn enqueue(&mut self, index: usize) {
        self.queue_tickets += 1;
        let ticket = self.queue_tickets;
        if let Some(t) = self.transfers[index].as_mut() {
            t.queue_ticket = ticket;
        }
        let entry = Queued { index, ticket };
        if self.queue.push(entry).is_err() {
            // Full of stale entries (live ones are at most half): compact.
            for _ in 0..self.queue.len() {
                if let Some(e) = self.queue.pop() {
                    if self.is_live(e) {
                        let _ = self.queue.push(e);
                    }
                }
            }
            let _ = self.queue.push(entry);
        }
    }

    fn is_live(&self, e: Queued) -> bool {
        self.transfers[e.index]
            .as_ref()
            .is_some_and(|t| t.queue_ticket == e.ticket && matches!(t.phase, Phase::Queued { .. }))
    }

    /// Dispatches queued transfers in queue order, as far as capacity
    /// goes: one pass over the queue. Once a role has no receiver with room
    /// its other requests are not tried; they wait for a capacity release.
    fn dispatch_queued(&mut self, now: Instant) {
        let mut blocked = [false; 8];
        for _ in 0..self.queue.len() {
            let Some(e) = self.queue.pop() else { return };
            if !self.is_live(e) {
                continue;
            }
            let (retry_at, sender) = match self.transfers[e.index].as_ref() {
                Some(Transfer {
                    phase: Phase::Queued { retry_at },
                    sender,
                    ..
                }) => (*retry_at, *sender),
                _ => continue,
            };
            let role = self.member(sender).map_or(0, |m| m.role + 1);
            let is_blocked = blocked.get(role).copied().unwrap_or(true);
            if !is_blocked && retry_at.is_none_or(|at| at <= now) {
                self.dispatch(now, e.index);
            } else if is_blocked {
                // Waits for a capacity release, like the one that failed.
                if let Some(t) = self.transfers[e.index].as_mut() {
                    t.phase = Phase::Queued {
                        retry_at: retry_at.filter(|at| *at > now),
                    };
                }
            }
            if self.is_live(e) {
                if matches!(
                    self.transfers[e.index].as_ref().map(|t| t.phase),
                    Some(Phase::Queued { retry_at: None })
                ) {
                    if let Some(b) = blocked.get_mut(role) {
                        *b = true;
                    }
                }
                let _ = self.queue.push(e);
            }
        }
    }

    // ---- replies -------------------------------------------------------------

    fn on_allocated(
        &mut self,
        now: Instant,
        from: PeerId,
        m: &Allocated<'_>,
    ) -> Result<(), Ignored> {
        let i = self.expect(m.request_id, from, false, |p| *p == Phase::Allocating)?;
        let t = self.transfers[i].as_ref().ok_or(Ignored::UnknownRequest)?;
        let (receiver, data_size, id, sender) = (t.receiver, t.data_size, t.id, t.sender);
        let r = receiver
            .and_then(|r| self.member(r))
            .ok_or(Ignored::WrongPeer)?;
        if !r.session.eq_json(m.session_id) {
            return Err(Ignored::WrongPeer);
        }
        let end = m.slot_offset.checked_add(m.slot_size);
        let dest_addr = r.pool_ptr.checked_add(m.slot_offset);
        let (session, fits) = (
            r.session,
            m.slot_size >= data_size && end.is_some_and(|e| e <= r.pool_size),
        );
        let (Some(dest_addr), true) = (dest_addr, fits) else {
            self.fail(now, i, FailReason::BadSlot);
            return Ok(());
        };
        let Some(sender_peer) = self.member(sender).map(|s| s.peer) else {
            self.fail(now, i, FailReason::PeerGone);
            return Ok(());
        };
        if let Some(t) = self.transfers[i].as_mut() {
            t.slot_offset = m.slot_offset;
            t.phase = Phase::Pushing;
            t.deadline = now + self.config.timeouts.push;
        }
        self.send(
            sender_peer,
            OutMsg::Push {
                id,
                dest_session: session,
                dest_addr,
                transfer_size: data_size,
            },
        );
        Ok(())
    }

    fn on_reject(
        &mut self,
        now: Instant,
        from: PeerId,
        m: &AllocReject<'_>,
    ) -> Result<(), Ignored> {
        let i = self.expect(m.request_id, from, false, |p| *p == Phase::Allocating)?;
        let attempts = self.transfers[i].as_ref().map_or(0, |t| t.attempts);
        if !m.retryable || attempts >= self.config.max_attempts {
            self.fail(now, i, FailReason::Rejected);
            return Ok(());
        }
        self.release(i);
        let backoff = self.config.retry_backoff * attempts;
        if let Some(t) = self.transfers[i].as_mut() {
            t.phase = Phase::Queued {
                retry_at: Some(now + backoff),
            };
            t.deadline = t.queued_until.max(now + backoff);
        }
        self.enqueue(i);
        self.dispatch_queued(now);
        Ok(())
    }

    fn on_pushed(&mut self, now: Instant, from: PeerId, m: &Pushed<'_>) -> Result<(), Ignored> {
        let i = self.expect(m.request_id, from, true, |p| *p == Phase::Pushing)?;
        if !m.success {
            self.fail(now, i, FailReason::WriteFailed);
            return Ok(());
        }
        let Some(receiver) = self.transfers[i].as_ref().and_then(|t| t.receiver) else {
            return Err(Ignored::WrongState);
        };
        let Some(peer) = self.member(receiver).map(|r| r.peer) else {
            self.fail(now, i, FailReason::PeerGone);
            return Ok(());
        };
        let seq = match self.transfers[i].as_mut() {
            Some(t) => {
                t.phase = Phase::Ready;
                t.deadline = now + self.config.timeouts.done;
                t.seq
            }
            None => return Err(Ignored::UnknownRequest),
        };
        self.send(peer, OutMsg::Ready { index: i, seq });
        Ok(())
    }

    fn on_done(&mut self, now: Instant, from: PeerId, m: &Done<'_>) -> Result<(), Ignored> {
        let i = match self.expect(m.request_id, from, false, |p| *p == Phase::Ready) {
            Ok(i) => i,
            Err(Ignored::UnknownRequest) => return self.late_done(from, m.request_id),
            Err(e) => return Err(e),
        };
        let Some(t) = self.transfers[i].as_ref() else {
            return Err(Ignored::UnknownRequest);
        };
        let (id, leg) = (t.id, t.sender_role);
        if m.error.is_some() {
            self.end(now, i);
            self.stats.failed += 1;
            self.event(CoordinatorEvent::Failed {
                id,
                leg,
                reason: FailReason::ReceiverError,
            });
        } else {
            self.end(now, i);
            self.stats.delivered += 1;
            self.event(CoordinatorEvent::Delivered { id, leg });
        }
        self.dispatch_queued(now);
        Ok(())
    }

    /// A `transfer_done` for a request that already failed: the receiver
    /// has let go of its preallocated slot now.
    fn late_done(&mut self, from: PeerId, id: JsonStr<'_>) -> Result<(), Ignored> {
        let found = self.parked.iter().position(|p| {
            p.is_some_and(|p| {
                p.held && p.id.eq_json(id) && self.member(p.member).is_some_and(|m| m.peer == from)
            })
        });
        let Some(pi) = found else {
            return Err(Ignored::UnknownRequest);
        };
        let Some(p) = self.parked[pi] else {
            return Err(Ignored::UnknownRequest);
        };
        if self.member(p.member).map(|m| m.peer) != Some(from) {
            return Err(Ignored::WrongPeer);
        }
        self.parked[pi] = None;
        if let Some(m) = self.member_mut(p.member) {
            let _ = m.prealloc.give_back(p.slot_id);
        }
        Ok(())
    }

    // ---- endings ---------------------------------------------------------------

    /// Gives the receiver's capacity back (once: the ticket is taken).
    fn release(&mut self, i: usize) {
        let Some(t) = self.transfers[i].as_mut() else {
            return;
        };
        let (ticket, receiver) = (t.ticket.take(), t.receiver.take());
        if let (Some(ticket), Some(r)) = (ticket, receiver) {
            if let Some(m) = self.member_mut(r) {
                let _ = m.capacity.release(ticket);
            }
        }
        if let Some(t) = self.transfers[i].as_mut() {
            t.receiver = receiver;
        }
    }

    /// Ends transfer `i` after `transfer_done`: capacity and preallocated
    /// slot back, record gone.
    fn end(&mut self, _now: Instant, i: usize) {
        self.release(i);
        let Some(t) = self.transfers[i].take() else {
            return;
        };
        self.finished.bury(t.id, Leg::FromRole(t.sender_role));
        if let (Some(slot_id), Some(r)) = (t.prealloc, t.receiver) {
            if let Some(m) = self.member_mut(r) {
                let _ = m.prealloc.give_back(slot_id);
            }
        }
    }

    /// Fails transfer `i`: aborts to everyone involved, capacity back,
    /// preallocated slot parked, record gone.
    fn fail(&mut self, now: Instant, i: usize, reason: FailReason) {
        self.release(i);
        let Some(t) = self.transfers[i].take() else {
            return;
        };
        self.finished.bury(t.id, Leg::FromRole(t.sender_role));
        let abort = OutMsg::Abort {
            id: t.id,
            reason: reason.as_str(),
            source_role: t.sender_role,
        };
        if t.phase != Phase::Ready {
            if let Some(peer) = self.member(t.sender).map(|m| m.peer) {
                self.send(peer, abort);
            }
        }
        if let Some(r) = t.receiver {
            if let Some(peer) = self.member(r).map(|m| m.peer) {
                self.send(peer, abort);
            }
            if let Some(slot_id) = t.prealloc {
                let held = t.phase == Phase::Ready;
                let wait = if held {
                    self.config.late_done_wait
                } else {
                    self.config.quarantine
                };
                let parked = Parked {
                    member: r,
                    slot_id,
                    id: t.id,
                    until: now + wait,
                    held,
                };
                // No room to park: keep the slot taken rather than risk a
                // write landing in a reused slot. It comes back when the
                // instance registers again.
                if let Some(p) = self.parked.iter_mut().find(|p| p.is_none()) {
                    *p = Some(parked);
                }
            }
        }
        self.stats.failed += 1;
        self.event(CoordinatorEvent::Failed {
            id: t.id,
            leg: t.sender_role,
            reason,
        });
    }

    /// Fails what has waited too long, retries what waited for backoff, and
    /// returns parked slots whose quarantine is over.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.transfers.len() {
            let Some(t) = self.transfers[i].as_ref() else {
                continue;
            };
            if t.deadline <= now {
                let reason = match t.phase {
                    Phase::Queued { .. } => FailReason::QueueTimeout,
                    Phase::Allocating => FailReason::AllocTimeout,
                    Phase::Pushing => FailReason::PushTimeout,
                    Phase::Ready => FailReason::DoneTimeout,
                };
                self.fail(now, i, reason);
            }
        }
        for pi in 0..self.parked.len() {
            let Some(p) = self.parked[pi] else { continue };
            if p.until <= now {
                self.parked[pi] = None;
                if let Some(m) = self.member_mut(p.member) {
                    let _ = m.prealloc.give_back(p.slot_id);
                }
            }
        }
        self.dispatch_queued(now);
    }
}
