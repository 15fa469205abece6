//! An instance's tables, in caller storage or (feature `alloc`) its own.

use super::*;

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

/// The lengths of an [`InstanceStorage`]'s slices
/// ([`InstanceStorage::storage_needed`]); a slice named here for two or
/// three fields is as long for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceSizes {
    /// `tree` (see [`Buddy::storage_needed`]).
    pub tree: usize,
    /// `generations`.
    pub generations: usize,
    /// `requests`.
    pub requests: TableSizes,
    /// `nested`.
    pub nested: usize,
    /// `prealloc`, `prealloc_use`, `prealloc_timers` and
    /// `prealloc_timer_places`.
    pub prealloc: usize,
    /// `prealloc_index`.
    pub prealloc_index: usize,
    /// `transmits`.
    pub transmits: usize,
    /// `actions`.
    pub actions: usize,
    /// `events`.
    pub events: usize,
    /// `tombstones`.
    pub tombstones: usize,
    /// `tombstones_index`.
    pub tombstones_index: usize,
    /// `arrivals`.
    pub arrivals: TableSizes,
    /// `landing_index`.
    pub landing_index: usize,
    /// `landing_hashes`.
    pub landing_hashes: usize,
    /// `held`.
    pub held: usize,
}

impl InstanceStorage<'_> {
    /// The lengths of the tables an instance needs for `limits`
    /// (`requests` in flight, each with `nested_per_request` bytes of
    /// nested JSON, `tombstones` ended requests), a pool of `pool` with
    /// `prealloc` preallocated slots, and queues that are never full:
    /// what [`owned`](InstanceStorage::owned) allocates, and what a caller
    /// that places the tables itself gives.
    pub fn storage_needed(
        limits: &crate::handshake::Limits,
        pool: &crate::slots::BuddyConfig,
        prealloc: usize,
    ) -> Result<InstanceSizes, BuddyError> {
        let (tree, generations) = Buddy::storage_needed(pool)?;
        let n = limits.requests.max(1);
        let tombstones = limits.tombstones.max(1);
        Ok(InstanceSizes {
            tree,
            generations,
            requests: TableStorage::<Request>::storage_needed(n, true),
            nested: n * limits.nested_per_request,
            prealloc,
            prealloc_index: Index::places_for(prealloc),
            // Per request at most a few messages and events are queued at
            // once (staged, allocated or reject, pushed, done).
            transmits: 4 * n + 8,
            actions: n,
            events: 4 * n + 8,
            tombstones,
            tombstones_index: Index::places_for(tombstones),
            arrivals: TableStorage::<Arrival>::storage_needed(n, true),
            landing_index: Index::places_for(n),
            landing_hashes: n,
            held: 2 * n,
        })
    }
}

#[cfg(feature = "alloc")]
impl InstanceStorage<'static> {
    /// Tables of their own, sized by
    /// [`storage_needed`](InstanceStorage::storage_needed).
    pub fn owned(limits: &Limits, pool: &BuddyConfig, prealloc: usize) -> Result<Self, BuddyError> {
        use crate::managed::{empty, filled};
        let n = Self::storage_needed(limits, pool, prealloc)?;
        let none = PreallocatedSlot {
            offset: 0,
            size: 0,
            slot_id: 0,
            addr: 0,
        };
        Ok(Self {
            tree: filled(n.tree, 0),
            generations: filled(n.generations, 0),
            requests: TableStorage::owned(n.requests.records, true),
            nested: filled(n.nested, 0),
            prealloc: filled(n.prealloc, none),
            prealloc_use: filled(n.prealloc, PreallocUse::FREE),
            transmits: empty(n.transmits),
            actions: empty(n.actions),
            events: empty(n.events),
            tombstones: filled(n.tombstones, Tombstone::EMPTY),
            tombstones_index: filled(n.tombstones_index, 0),
            arrivals: TableStorage::owned(n.arrivals.records, true),
            landing_index: filled(n.landing_index, 0),
            landing_hashes: filled(n.landing_hashes, 0),
            prealloc_index: filled(n.prealloc_index, 0),
            prealloc_timers: filled(n.prealloc, (0, 0)),
            prealloc_timer_places: filled(n.prealloc, 0),
            held: empty(n.held),
            hash_key: crate::handshake::tables::default_key(),
        })
    }
}
