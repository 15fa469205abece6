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
            hash_key: crate::handshake::tables::default_key(),
        })
    }
}
