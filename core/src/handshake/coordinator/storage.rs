//! A coordinator's tables, in caller storage or (feature `alloc`) its own.

use super::*;

/// A coordinator's tables: the caller's (`(&mut table).into()` each, a
/// [`TableStorage`] for each table), or its own ([`owned`](Self::owned),
/// feature `alloc`).
pub struct CoordinatorStorage<'s> {
    /// Preallocated slots a member may register (at most
    /// [`MAX_PREALLOC_PER_MEMBER`]): a registration with more is refused.
    /// `parked` needs room for this many per member.
    pub prealloc_per_member: usize,
    /// One per instance that may register.
    pub members: TableStorage<'s, Member>,
    /// The members' index by session: as many places as `members.index`.
    pub sessions: ManagedSlice<'s, u64>,
    /// The members' index by work endpoint: likewise.
    pub endpoints: ManagedSlice<'s, u64>,
    /// The receivers with room, ranked, per role: [`MAX_ROLES`] times as
    /// many entries as members.
    pub ranking: ManagedSlice<'s, HeapEntry>,
    /// The ranking's places: one per member.
    pub ranking_places: ManagedSlice<'s, u64>,
    /// The receivers with room, by room alone, per role (for data no
    /// preallocated slot of the role fits): as large as `ranking`.
    pub room_ranking: ManagedSlice<'s, HeapEntry>,
    /// Its places: one per member.
    pub room_ranking_places: ManagedSlice<'s, u64>,
    /// One per request in flight, with deadlines.
    pub transfers: TableStorage<'s, Transfer>,
    /// Manifest and scalar-field bytes, split evenly among `transfers`.
    pub nested: ManagedSlice<'s, u8>,
    /// Messages not yet polled; at least two per transfer plus one per
    /// member is never full.
    pub transmits: ManagedSlice<'s, Option<Outgoing>>,
    /// Events not yet polled.
    pub events: ManagedSlice<'s, Option<CoordinatorEvent>>,
    /// Preallocated slots out of use, with deadlines.
    pub parked: TableStorage<'s, Parked>,
    /// Legs of requests that ended, newest overwriting oldest, so that a
    /// duplicated `transfer_staged` arriving late is not taken for a new
    /// request. Request ids must not be reused while they are here.
    pub finished: ManagedSlice<'s, Tombstone>,
    /// Their index: [`TableStorage::index_places`] of `finished`.
    pub finished_index: ManagedSlice<'s, u64>,
    /// Room for the admission list ([`Coordinator::admit`]); may be empty
    /// when no list is kept.
    pub admitted: ManagedSlice<'s, Option<Admitted>>,
    /// The endpoints the coordinator names at once
    /// ([`Coordinator::handle_incoming`]): members and strangers. Members
    /// must take at most a quarter of it ([`peer_table_len`] places per
    /// member table); may be empty for callers that name peers themselves
    /// ([`Coordinator::handle`]).
    pub peers: ManagedSlice<'s, PeerSlot>,
    /// Their index: [`TableStorage::index_places`] of `peers`.
    pub peer_index: ManagedSlice<'s, u64>,
    /// The key of every index (see [`HashKey`]).
    pub hash_key: HashKey,
}

#[cfg(feature = "alloc")]
impl CoordinatorStorage<'static> {
    /// Tables of their own, sized by `limits`: `requests` transfers (and
    /// as many bytes of nested JSON each as `nested_per_request`),
    /// `members` instances, `tombstones` ended legs, and queues that are
    /// never full; with the `std` feature, a random hash key.
    pub fn owned(limits: &crate::handshake::Limits) -> Self {
        use crate::managed::{empty, filled};
        let n = limits.requests.max(1);
        let members = limits.members.max(1);
        let tombstones = limits.tombstones.max(1);
        let per_member = limits.prealloc_per_member.min(MAX_PREALLOC_PER_MEMBER);
        Self {
            prealloc_per_member: per_member,
            members: TableStorage::owned(members, false),
            sessions: filled(Index::places_for(members), 0),
            endpoints: filled(Index::places_for(members), 0),
            ranking: filled(MAX_ROLES * members, (0, 0)),
            ranking_places: filled(members, 0),
            room_ranking: filled(MAX_ROLES * members, (0, 0)),
            room_ranking_places: filled(members, 0),
            transfers: TableStorage::owned(n, true),
            nested: filled(n * limits.nested_per_request, 0),
            // Two per transfer plus one per member is never full.
            transmits: empty(2 * n + members + 8),
            events: empty(2 * n + members + 8),
            parked: TableStorage::owned(n + members * per_member, true),
            finished: filled(tombstones, Tombstone::EMPTY),
            finished_index: filled(Index::places_for(tombstones), 0),
            admitted: empty(members),
            peers: filled(peer_table_len(members), PeerSlot::EMPTY),
            peer_index: filled(Index::places_for(peer_table_len(members)), 0),
            hash_key: crate::handshake::tables::default_key(),
        }
    }
}

/// The places of a peer table for `members` members: four per member and
/// 64 more, so that strangers (registrations refused, forgers) always find
/// places to take over, and the members' places are never taken.
pub const fn peer_table_len(members: usize) -> usize {
    members.saturating_mul(4).saturating_add(64)
}

/// The most preallocated slots a coordinator takes from one instance
/// ([`Limits::prealloc_per_member`](crate::handshake::Limits::prealloc_per_member)
/// chooses how many, up to this).
pub const MAX_PREALLOC_PER_MEMBER: usize = 32;
