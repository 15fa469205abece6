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
//!
//! Every per-message operation is O(1) expected (O(log n) where time or
//! a receiver's rank moves): transfers, parked slots and members are found
//! through keyed hash indexes, deadlines wait in a heap, queued transfers
//! in a list per role, and receivers in a heap per role by rank. What
//! scans a table happens once per member lost or replaced, not per
//! message.

use core::fmt;
use core::time::Duration;

use super::common::{
    nested_json, Graveyard, Ignored, Instant, Leg, Name, PeerId, Reason, RequestId, Text, NAME_LEN,
};
use super::ring::Ring;
use super::tables::heap::Heaps;
use super::tables::index::Index;
use super::tables::table::{Record, Table};
use super::tables::{HashKey, TableSizes, TableStorage};
use super::{
    GraveyardSizes, GraveyardStorage, HeapSizes, HeapStorage, Limits, RequestsSizes,
    RequestsStorage, StorageError,
};
use crate::json::{BufferTooSmall, JsonStr, RawJson, Sink};
use crate::managed::ManagedSlice;
use crate::slots::{Capacity, CapacityTicket, PoolRange, PreallocTable};
use crate::wire::{
    Abort, Alloc, AllocReject, Allocated, Deregister, Done, Manifest, Msg, Push, Pushed, Ready,
    Register, RegisterAck, Staged,
};
use peers::Peers;
pub use peers::{PeerSlot, Unhandled};

mod api;
mod config;
mod dispatch;
pub use api::{CoordinatorEvent, CoordinatorStats, LegTiming, Transmit};
pub use config::{ConfigError, CoordinatorConfig, Policy, Timeouts};
mod endings;
mod fail;
pub use fail::FailReason;
mod lookups;
use lookups::member_of;
mod outbox;
use outbox::Outbox;
pub use outbox::{OutboxSizes, OutboxStorage};
mod output;
mod peers;
mod queue;
mod registration;
mod registry;
mod remains;
mod replies;
mod storage;
mod transfers;
use registry::Registry;
pub use registry::{RegistrySizes, RegistryStorage};
use remains::Remains;
pub use remains::{RemainsSizes, RemainsStorage};
pub use storage::{peer_table_len, CoordinatorSizes, CoordinatorStorage, MAX_PREALLOC_PER_MEMBER};
use transfers::Transfers;
pub use transfers::{TransfersSizes, TransfersStorage};

/// What the coordinator's indexes hash: a request id, a peer, a session,
/// an endpoint.
const NS_ID: u64 = 0;
const NS_PEER: u64 = 1;
const NS_SESSION: u64 = 2;
const NS_ENDPOINT: u64 = 3;

/// No transfer: the end of a role's queue.
const NONE: u32 = u32::MAX;

/// An endpoint that may register as a role: an entry of the admission
/// list ([`Coordinator::admit`]).
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    role: usize,
    endpoint: Name,
}

/// A registered instance.
#[derive(Debug)]
pub struct Member {
    peer: PeerId,
    role: usize,
    session: Name,
    endpoint: Name,
    /// Who the control channel authenticated its registration as (empty:
    /// a channel that authenticates no one); its later messages must come
    /// as the same.
    user: Name,
    pool_ptr: u64,
    pool_size: u64,
    prealloc: PreallocTable<MAX_PREALLOC_PER_MEMBER>,
    capacity: Capacity,
    epoch: u32,
    /// When it was last chosen, for round robin (0: never).
    last_pick: u64,
    /// Its preallocated slots taken, as last counted into the total.
    counted_taken: usize,
    /// It drains (`transfer_deregister{draining}`): it is never chosen as
    /// a receiver again, and finishes what it holds.
    draining: bool,
    /// It was told nothing is addressed to it any more (its drain's end).
    drain_told: bool,
    /// How late its writes may land after they are posted (its
    /// registration's `write_lifetime_ms`): a preallocated slot a failed
    /// write of its may still land in is parked this long at least, plus
    /// the message delay.
    write_lifetime: Duration,
}

impl Record for Member {
    fn key_hash(&self, key: &HashKey) -> u64 {
        key.number(u64::from(self.peer.0), NS_PEER)
    }
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
    /// In its role's queue, between these transfers.
    queued: bool,
    prev: u32,
    next: u32,
    /// When its `transfer_staged` arrived.
    staged_at: Instant,
    /// When its (latest) `transfer_push` went out.
    pushed_at: Instant,
    /// When its `transfer_ready` went out.
    ready_at: Instant,
}

impl Record for Transfer {
    fn key_hash(&self, key: &HashKey) -> u64 {
        key.bytes(self.id.as_bytes(), NS_ID)
    }

    fn due(&self) -> Option<Instant> {
        Some(match self.phase {
            Phase::Queued { retry_at: Some(at) } => self.deadline.min(at),
            _ => self.deadline,
        })
    }
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

impl Record for Parked {
    fn key_hash(&self, key: &HashKey) -> u64 {
        key.bytes(self.id.as_bytes(), NS_ID)
    }

    fn due(&self) -> Option<Instant> {
        Some(self.until)
    }
}

/// A message to send.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing {
    to: PeerId,
    /// The generation of `to`'s place in the peer table when queued.
    generation: u32,
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
    /// `transfer_deregister` back to a draining member: nothing is
    /// addressed to it any more.
    Drained { session: Name },
}

/// The longest pipeline role name a coordinator keeps.
pub const ROLE_LEN: usize = 64;
/// The most roles a pipeline may have.
pub const MAX_ROLES: usize = 8;

/// The coordinator's state machine.
pub struct Coordinator<'s> {
    config: CoordinatorConfig,
    roles: [Text<ROLE_LEN>; MAX_ROLES],
    role_count: usize,
    /// The members and what indexes and ranks them.
    registry: Registry<'s>,
    /// The requests in flight and their queues.
    transfers: Transfers<'s>,
    /// The queues its caller polls.
    outbox: Outbox<'s>,
    /// The parked slots and tombstones of requests that ended.
    remains: Remains<'s>,
    epochs: u32,
    admitted: ManagedSlice<'s, Option<Admitted>>,
    /// The endpoints it names peers by.
    peers: Peers<'s>,
    /// Per role, the local endpoint its messages arrive at, on channels
    /// that cannot name senders.
    role_endpoints: [Option<Name>; MAX_ROLES],
    /// Preallocated slots a member may register.
    prealloc_per_member: usize,
    /// Registrations are refused unless the admission list names them.
    admission: bool,
    /// No new registration or transfer is taken ([`Coordinator::drain`]).
    draining: bool,
    stats: CoordinatorStats,
}

impl fmt::Debug for Coordinator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<'s> Coordinator<'s> {
    /// A coordinator with no instance registered, relaying along
    /// `pipeline` (roles in hand-off order, e.g. `["encoder", "denoiser",
    /// "decoder"]`: a request staged by a role goes to the next one).
    pub fn new(
        pipeline: &[&str],
        config: CoordinatorConfig,
        mut storage: CoordinatorStorage<'s>,
    ) -> Result<Self, ConfigError> {
        if pipeline.is_empty() || pipeline.len() > MAX_ROLES {
            return Err(ConfigError::Pipeline);
        }
        let mut roles = [Text::EMPTY; MAX_ROLES];
        for (i, (kept, role)) in roles.iter_mut().zip(pipeline).enumerate() {
            // A role names one place in the pipeline: a message's sender
            // is judged by it (`set_role_endpoint`, a registration's role).
            if pipeline[..i].contains(role) {
                return Err(ConfigError::Pipeline);
            }
            *kept = Text::new(role).map_err(|_| ConfigError::RoleTooLong)?;
        }
        let key = storage.hash_key;
        // The queues are as long as the transfers and members need.
        let limits = Limits {
            requests: storage.transfers.requests.records.len(),
            members: storage.registry.members.records.len(),
            ..Limits::COORDINATOR
        };
        storage
            .outbox
            .check(&OutboxStorage::storage_needed(&limits))
            .map_err(ConfigError::Storage)?;
        let registry = Registry::new(storage.registry, key, pipeline.len())?;
        if !storage.peers.is_empty() && storage.peers.len() <= registry.members.capacity() {
            return Err(ConfigError::PeerTableTooSmall);
        }
        let transfers = Transfers::new(storage.transfers, key)?;
        // Slots are parked for the transfers, members and slots per member
        // the other parts hold.
        let kept = Limits {
            prealloc_per_member: storage.prealloc_per_member,
            tombstones: storage.remains.finished.stones.len(),
            ..limits
        };
        let remains = Remains::new(storage.remains, key, &kept)?;
        storage.admitted.iter_mut().for_each(|a| *a = None);
        Ok(Self {
            config,
            roles,
            role_count: pipeline.len(),
            registry,
            transfers,
            remains,
            outbox: Outbox::new(storage.outbox),
            epochs: 0,
            admitted: storage.admitted,
            peers: Peers::new(storage.peers, storage.peer_index),
            role_endpoints: [None; MAX_ROLES],
            prealloc_per_member: storage.prealloc_per_member.min(MAX_PREALLOC_PER_MEMBER),
            admission: false,
            draining: false,
            stats: CoordinatorStats::default(),
        })
    }

    /// Lets `endpoint` (a work endpoint, as registrations name it) register
    /// as `role`. Once any endpoint is admitted, every registration the
    /// list does not name is dropped unanswered ([`CoordinatorEvent::Refused`]
    /// says so), as sglang's head drops those outside its
    /// `--encoder-urls`, `--denoiser-urls` and `--decoder-urls`; without a
    /// list, any endpoint may register.
    pub fn admit(&mut self, role: &str, endpoint: &str) -> Result<(), ConfigError> {
        let role = self.role_named(role)?;
        let endpoint = Name::new(endpoint).map_err(|_| ConfigError::EndpointTooLong)?;
        let free = self
            .admitted
            .iter_mut()
            .find(|a| a.is_none())
            .ok_or(ConfigError::AdmissionFull)?;
        *free = Some(Admitted { role, endpoint });
        self.admission = true;
        Ok(())
    }

    /// True unless an admission list is kept and does not name `endpoint`
    /// as `role`.
    fn admits(&self, role: Option<usize>, endpoint: &Name) -> bool {
        !self.admission
            || role.is_some_and(|role| {
                self.admitted
                    .iter()
                    .flatten()
                    .any(|a| a.role == role && a.endpoint == *endpoint)
            })
    }

    /// Counters.
    pub fn stats(&self) -> &CoordinatorStats {
        &self.stats
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.transfers.records.len()
    }

    /// Takes no new work from now on: a `transfer_staged` of a new request
    /// is answered with `transfer_abort` ([`FailReason::ShuttingDown`]) and
    /// a registration refused, while the requests in flight go on to their
    /// end, through their next legs too. What a
    /// service does on SIGTERM before [`shutdown`](Self::shutdown), so that
    /// a stop loses as little as it can.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// True once [`drain`](Self::drain) or [`shutdown`](Self::shutdown)
    /// was called.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Fails every transfer in flight ([`FailReason::ShuttingDown`]: each
    /// instance involved is sent `transfer_abort`) and takes no new work:
    /// the last call before the coordinator stops, so that no instance
    /// waits for a coordinator that is gone. Reads the whole transfer
    /// table, once.
    pub fn shutdown(&mut self, now: Instant) {
        self.draining = true;
        for i in 0..self.transfers.records.capacity() {
            if self.transfers.records.get(i).is_some() {
                self.fail(now, i, FailReason::ShuttingDown);
            }
        }
    }

    /// Registered instances.
    pub fn members(&self) -> usize {
        self.registry.members.len()
    }

    /// Places the hash indexes read so far: the lookups' work, which no
    /// choice of ids can drive past [`MAX_PROBE`](super::tables::MAX_PROBE)
    /// places per lookup.
    pub fn probes(&self) -> u64 {
        self.registry.members.probes()
            + self.registry.sessions.probes()
            + self.registry.endpoints.probes()
            + self.transfers.records.probes()
            + self.remains.parked.probes()
            + self.remains.finished.probes()
            + self.peers.probes()
    }

    /// Capacity units in use on each registered instance, with its peer.
    pub fn capacity_in_use(&self) -> impl Iterator<Item = (PeerId, u32)> + '_ {
        self.registry
            .members
            .iter()
            .flatten()
            .map(|m| (m.peer, m.capacity.in_use()))
    }

    /// Preallocated slots taken or parked, over all instances.
    pub fn prealloc_taken(&self) -> usize {
        self.registry.prealloc_taken
    }

    /// The preallocated slot of `receiver` assigned (or parked) for
    /// request `id`: where it lies in the receiver's pool. One request has
    /// a transfer per leg, each to another receiver, so the pair names one
    /// slot.
    pub fn prealloc_for(&self, id: &str, receiver: PeerId) -> Option<PoolRange> {
        let slot = |r: MemberRef, slot_id: u64| {
            let m = self.member(r).filter(|m| m.peer == receiver)?;
            let (s, _) = m.prealloc.get(slot_id)?;
            Some(PoolRange::new(s.offset, s.size))
        };
        let hash = self.transfers.records.key().bytes(id.as_bytes(), NS_ID);
        let live = self
            .transfers
            .records
            .find(hash, |t| {
                t.id.as_str() == id
                    && t.receiver
                        .zip(t.prealloc)
                        .and_then(|(r, s)| slot(r, s))
                        .is_some()
            })
            .and_then(|i| self.transfers.records.get(i))
            .and_then(|t| slot(t.receiver?, t.prealloc?));
        live.or_else(|| {
            let p = self.remains.parked.find(hash, |p| {
                p.id.as_str() == id && slot(p.member, p.slot_id).is_some()
            })?;
            self.remains
                .parked
                .get(p)
                .and_then(|p| slot(p.member, p.slot_id))
        })
    }

    /// Handles a message from `from`. `Err` says why it was ignored; it
    /// changed nothing.
    pub fn handle(&mut self, now: Instant, from: PeerId, msg: &Msg<'_>) -> Result<(), Ignored> {
        self.handle_as(Arrived { now, from }, "", msg)
    }

    /// [`handle`](Self::handle) of a message whose connection the channel
    /// authenticated as `user` (empty: as no one). A registration is bound
    /// to its `user`; any other message is taken only from the `user` its
    /// sender registered as.
    fn handle_as(&mut self, at: Arrived, user: &str, msg: &Msg<'_>) -> Result<(), Ignored> {
        let r = match msg {
            Msg::Register(m) => self.on_register(at, user, m),
            _ if !user.is_empty() && !self.spoken_for_by(at.from, user) => Err(Ignored::WrongKey),
            Msg::Staged(m) => self.on_staged(at, m),
            Msg::Allocated(m) => self.on_allocated(at, m),
            Msg::AllocReject(m) => self.on_reject(at, m),
            Msg::Pushed(m) => self.on_pushed(at, m),
            Msg::Done(m) => self.on_done(at, m),
            Msg::Deregister(m) => self.on_deregister(at, m),
            _ => Err(Ignored::UnexpectedType),
        };
        if r.is_err() {
            self.stats.ignored += 1;
        }
        r
    }
}

/// When a message arrived and from which peer: what every handler is
/// given beside the message itself.
#[derive(Clone, Copy, Debug)]
pub(super) struct Arrived {
    /// The time the caller handles it at.
    pub(super) now: Instant,
    /// Who sent it, as the control channel names them.
    pub(super) from: PeerId,
}
