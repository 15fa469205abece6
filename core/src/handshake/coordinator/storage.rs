//! A coordinator's tables, in caller storage or (feature `alloc`) its own.

use super::*;

/// A coordinator's tables: the caller's (`(&mut table).into()` each, a
/// [`TableStorage`] for each table), or its own (`owned`,
/// feature `alloc`).
pub struct CoordinatorStorage<'s> {
    /// Preallocated slots a member may register (at most
    /// [`MAX_PREALLOC_PER_MEMBER`]): a registration with more is refused.
    /// `remains.parked` is sized for this many per member.
    pub prealloc_per_member: usize,
    /// The members and what indexes and ranks them, as long as
    /// [`RegistryStorage::storage_needed`] says.
    pub registry: RegistryStorage<'s>,
    /// The requests in flight, as long as
    /// [`TransfersStorage::storage_needed`] says.
    pub transfers: TransfersStorage<'s>,
    /// The queues the caller polls, as long as
    /// [`OutboxStorage::storage_needed`] says.
    pub outbox: OutboxStorage<'s>,
    /// The parked slots and tombstones of requests that ended, as long
    /// as [`RemainsStorage::storage_needed`] says.
    pub remains: RemainsStorage<'s>,
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

/// The lengths of a [`CoordinatorStorage`]'s slices
/// ([`CoordinatorStorage::storage_needed`]); a length named here for two
/// fields is as long for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoordinatorSizes {
    /// What `prealloc_per_member` is set to.
    pub prealloc_per_member: usize,
    /// `registry` ([`RegistryStorage::storage_needed`]).
    pub registry: RegistrySizes,
    /// `transfers` ([`TransfersStorage::storage_needed`]).
    pub transfers: TransfersSizes,
    /// `outbox` ([`OutboxStorage::storage_needed`]).
    pub outbox: OutboxSizes,
    /// `remains` ([`RemainsStorage::storage_needed`]).
    pub remains: RemainsSizes,
    /// `admitted`.
    pub admitted: usize,
    /// `peers`.
    pub peers: usize,
    /// `peer_index`.
    pub peer_index: usize,
}

impl CoordinatorStorage<'_> {
    /// The lengths of the tables a coordinator needs for `limits`:
    /// `requests` transfers (and as many bytes of nested JSON each as
    /// `nested_per_request`), `members` instances, `tombstones` ended
    /// legs, and queues that are never full: what
    /// `owned` allocates, and what a caller
    /// that places the tables itself gives.
    pub fn storage_needed(limits: &crate::handshake::Limits) -> CoordinatorSizes {
        let members = limits.members.max(1);
        let per_member = limits.prealloc_per_member.min(MAX_PREALLOC_PER_MEMBER);
        CoordinatorSizes {
            prealloc_per_member: per_member,
            registry: RegistryStorage::storage_needed(limits),
            transfers: TransfersStorage::storage_needed(limits),
            outbox: OutboxStorage::storage_needed(limits),
            remains: RemainsStorage::storage_needed(limits),
            admitted: members,
            peers: peer_table_len(members),
            peer_index: Index::places_for(peer_table_len(members)),
        }
    }
}

#[cfg(feature = "alloc")]
impl CoordinatorStorage<'static> {
    /// Tables of their own, sized by
    /// [`storage_needed`](CoordinatorStorage::storage_needed); with the
    /// `std` feature, a random hash key.
    pub fn owned(limits: &crate::handshake::Limits) -> Self {
        use crate::managed::{empty, filled};
        let n = Self::storage_needed(limits);
        Self {
            prealloc_per_member: n.prealloc_per_member,
            registry: RegistryStorage::owned(&n.registry),
            transfers: TransfersStorage::owned(&n.transfers),
            outbox: OutboxStorage::owned(&n.outbox),
            remains: RemainsStorage::owned(&n.remains),
            admitted: empty(n.admitted),
            peers: filled(n.peers, PeerSlot::EMPTY),
            peer_index: filled(n.peer_index, 0),
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
