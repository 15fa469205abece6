//! Owned storage for the state machines, sized by [`Limits`], and the
//! owned pairs of storage and state machine that the runtime drives.
//!
//! ferry-core's machines borrow caller storage (`Instance<'s>`); a runtime
//! that lives as long as it likes needs both in one value, which
//! `ouroboros` builds without unsafe code of ours.

use ferry_core::handshake::coordinator::{
    ConfigError, Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, Member,
    Outgoing as CoordinatorOutgoing, Parked, Queued, Transfer,
};
use ferry_core::handshake::instance::{
    Instance, InstanceConfig, InstanceError, InstanceEvent, InstanceStorage,
    Outgoing as InstanceOutgoing, PreallocUse, Request, Write,
};
use ferry_core::handshake::{Instant, Tombstone};
use ferry_core::slots::{Buddy, BuddyConfig, BuddyError};
use ferry_core::wire::PreallocatedSlot;
use ouroboros::self_referencing;

/// Preallocated slots a coordinator keeps per instance.
pub const PREALLOC_PER_INSTANCE: usize = 16;

/// Table sizes of a state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests (instance) or transfers (coordinator) in flight at once.
    pub requests: usize,
    /// Bytes of manifest plus scalar fields one request may carry.
    pub nested_per_request: usize,
    /// Ended requests remembered, to ignore late duplicates.
    pub tombstones: usize,
    /// Instances a coordinator may have registered at once.
    pub members: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            requests: 128,
            nested_per_request: 16 * 1024,
            tombstones: 4096,
            members: 64,
        }
    }
}

fn slots<T>(n: usize) -> Vec<Option<T>> {
    (0..n).map(|_| None).collect()
}

/// An instance's tables, and the names its settings borrow.
pub struct InstanceStore {
    role: String,
    session: String,
    endpoint: String,
    tree: Vec<u8>,
    gens: Vec<u32>,
    requests: Vec<Option<Request>>,
    nested: Vec<u8>,
    prealloc: Vec<PreallocatedSlot>,
    prealloc_use: Vec<PreallocUse>,
    transmits: Vec<Option<InstanceOutgoing>>,
    actions: Vec<Option<Write>>,
    events: Vec<Option<InstanceEvent>>,
    tombstones: Vec<Tombstone>,
}

impl InstanceStore {
    /// Storage for an instance of `role`, addressed by `session` (data
    /// plane) and `endpoint` (control plane), over `pool` with `prealloc`
    /// receive slots.
    pub fn new(
        [role, session, endpoint]: [String; 3],
        limits: &Limits,
        pool: &BuddyConfig,
        prealloc: usize,
    ) -> Result<Self, BuddyError> {
        let (nodes, gens) = Buddy::storage_needed(pool)?;
        let empty = PreallocatedSlot {
            offset: 0,
            size: 0,
            slot_id: 0,
            addr: 0,
        };
        let n = limits.requests.max(1);
        Ok(Self {
            role,
            session,
            endpoint,
            tree: vec![0; nodes],
            gens: vec![0; gens],
            requests: slots(n),
            nested: vec![0; n * limits.nested_per_request],
            prealloc: vec![empty; prealloc],
            prealloc_use: vec![PreallocUse::FREE; prealloc],
            // Per request at most a few messages and events are queued
            // at once (staged, allocated or reject, pushed, done).
            transmits: slots(4 * n + 8),
            actions: slots(n),
            events: slots(4 * n + 8),
            tombstones: vec![Tombstone::EMPTY; limits.tombstones.max(1)],
        })
    }
}

/// An instance with its storage.
#[self_referencing]
pub struct OwnedInstance {
    store: InstanceStore,
    #[borrows(mut store)]
    #[not_covariant]
    machine: Instance<'this>,
}

impl OwnedInstance {
    /// Builds the instance over its own storage; the names in `config` are
    /// replaced by the store's.
    pub fn create(
        now: Instant,
        config: InstanceConfig<'static>,
        store: InstanceStore,
    ) -> Result<Self, InstanceError> {
        OwnedInstanceTryBuilder {
            store,
            machine_builder: |s: &mut InstanceStore| {
                Instance::new(
                    now,
                    InstanceConfig {
                        role: &s.role,
                        session_id: &s.session,
                        work_endpoint: &s.endpoint,
                        ..config
                    },
                    InstanceStorage {
                        tree: &mut s.tree,
                        generations: &mut s.gens,
                        requests: &mut s.requests,
                        nested: &mut s.nested,
                        prealloc: &mut s.prealloc,
                        prealloc_use: &mut s.prealloc_use,
                        transmits: &mut s.transmits,
                        actions: &mut s.actions,
                        events: &mut s.events,
                        tombstones: &mut s.tombstones,
                    },
                )
            },
        }
        .try_build()
    }

    /// Runs `f` on the instance.
    pub fn run<R>(&mut self, f: impl FnOnce(&mut Instance<'_>) -> R) -> R {
        self.with_machine_mut(f)
    }

    /// Runs `f` on the instance, read-only.
    pub fn read<R>(&self, f: impl FnOnce(&Instance<'_>) -> R) -> R {
        self.with_machine(f)
    }
}

/// A coordinator's tables.
pub struct CoordinatorStore {
    members: Vec<Option<Member<PREALLOC_PER_INSTANCE>>>,
    transfers: Vec<Option<Transfer>>,
    nested: Vec<u8>,
    transmits: Vec<Option<CoordinatorOutgoing>>,
    events: Vec<Option<CoordinatorEvent>>,
    parked: Vec<Option<Parked>>,
    queue: Vec<Option<Queued>>,
    finished: Vec<Tombstone>,
}

impl CoordinatorStore {
    /// Storage for a coordinator.
    pub fn new(limits: &Limits) -> Self {
        let n = limits.requests.max(1);
        let members = limits.members.max(1);
        Self {
            members: slots(members),
            transfers: slots(n),
            nested: vec![0; n * limits.nested_per_request],
            // Two per transfer plus one per member is never full.
            transmits: slots(2 * n + members + 8),
            events: slots(2 * n + members + 8),
            parked: slots(n + members * PREALLOC_PER_INSTANCE),
            queue: slots(2 * n),
            finished: vec![Tombstone::EMPTY; limits.tombstones.max(1)],
        }
    }
}

/// A coordinator with its storage and its pipeline's role names.
#[self_referencing]
pub struct OwnedCoordinator {
    roles: Vec<String>,
    #[borrows(roles)]
    #[covariant]
    role_refs: Vec<&'this str>,
    store: CoordinatorStore,
    #[borrows(mut store, role_refs)]
    #[not_covariant]
    machine: Coordinator<'this, PREALLOC_PER_INSTANCE>,
}

impl OwnedCoordinator {
    /// Builds the coordinator over its own storage, for the pipeline
    /// `roles` (the pipeline in `config` is replaced).
    pub fn create(
        roles: Vec<String>,
        config: CoordinatorConfig<'static>,
        store: CoordinatorStore,
    ) -> Result<Self, ConfigError> {
        OwnedCoordinatorTryBuilder {
            roles,
            role_refs_builder: |roles: &Vec<String>| Ok(roles.iter().map(String::as_str).collect()),
            store,
            machine_builder: |s: &mut CoordinatorStore, pipeline: &Vec<&str>| {
                Coordinator::new(
                    CoordinatorConfig {
                        pipeline: pipeline.as_slice(),
                        ..config
                    },
                    CoordinatorStorage {
                        members: &mut s.members,
                        transfers: &mut s.transfers,
                        nested: &mut s.nested,
                        transmits: &mut s.transmits,
                        events: &mut s.events,
                        parked: &mut s.parked,
                        queue: &mut s.queue,
                        finished: &mut s.finished,
                    },
                )
            },
        }
        .try_build()
    }

    /// Runs `f` on the coordinator.
    pub fn run<R>(
        &mut self,
        f: impl FnOnce(&mut Coordinator<'_, PREALLOC_PER_INSTANCE>) -> R,
    ) -> R {
        self.with_machine_mut(f)
    }
}
