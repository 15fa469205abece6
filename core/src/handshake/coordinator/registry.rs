//! The registry: the members, their indexes by session and by work
//! endpoint, the receivers ranked per role, and what is counted over all
//! members (slot bounds per role, round robin's clock, preallocated slots
//! taken). What is done with it lives in `registration.rs` and
//! `dispatch.rs`.

use super::*;

/// The members and what indexes and ranks them.
#[derive(Debug)]
pub(super) struct Registry<'s> {
    /// One per registered instance, keyed by peer.
    pub(super) members: Table<'s, Member>,
    /// The members by session.
    pub(super) sessions: Index<'s>,
    /// The members by work endpoint.
    pub(super) endpoints: Index<'s>,
    /// Per role, the members with room, best first by the policy.
    pub(super) ranking: Heaps<'s>,
    /// Per role, the members with room, most room first.
    pub(super) room_ranking: Heaps<'s>,
    /// Per role, the smallest and largest preallocated slot its members
    /// registered (`(u64::MAX, 0)`: none).
    pub(super) slot_bounds: [(u64, u64); MAX_ROLES],
    /// Round robin's clock: members chosen longest ago come first.
    pub(super) picks: u64,
    /// Preallocated slots taken or parked, over all members.
    pub(super) prealloc_taken: usize,
}

/// The registry's storage.
pub struct RegistryStorage<'s> {
    /// One per instance that may register.
    pub members: TableStorage<'s, Member>,
    /// The members' index by session: as many places as `members.index`.
    pub sessions: ManagedSlice<'s, u64>,
    /// The members' index by work endpoint: likewise.
    pub endpoints: ManagedSlice<'s, u64>,
    /// The receivers with room, ranked, per role: a lane per role of
    /// [`MAX_ROLES`], a place per member.
    pub ranking: HeapStorage<'s>,
    /// The receivers with room, by room alone, per role (for data no
    /// preallocated slot of the role fits): as large as `ranking`.
    pub room_ranking: HeapStorage<'s>,
}

/// The lengths of a [`RegistryStorage`]'s slices
/// ([`RegistryStorage::storage_needed`]); a length named here for two
/// fields is as long for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrySizes {
    /// `members`.
    pub members: TableSizes,
    /// `sessions` and `endpoints`.
    pub member_index: usize,
    /// `ranking` and `room_ranking`.
    pub ranking: HeapSizes,
}

impl RegistryStorage<'_> {
    /// The lengths for `limits`: `members` instances, each ranked in
    /// every role's heaps.
    pub fn storage_needed(limits: &Limits) -> RegistrySizes {
        let members = limits.members.max(1);
        RegistrySizes {
            members: TableStorage::<Member>::storage_needed(members, false),
            member_index: Index::places_for(members),
            ranking: HeapSizes::new(MAX_ROLES, members),
        }
    }

    /// The limits these slices were sized for: the members they hold.
    pub fn limits(&self) -> Limits {
        Limits {
            members: self.members.records.len(),
            ..Limits::COORDINATOR
        }
    }

    /// Refuses slices other than `needed` long, naming the first.
    pub fn check(&self, needed: &RegistrySizes) -> Result<(), StorageError> {
        self.members.check("registry.members", &needed.members)?;
        let index = needed.member_index;
        StorageError::check_each(
            "registry",
            [
                ("sessions", index, self.sessions.len()),
                ("endpoints", index, self.endpoints.len()),
            ],
        )?;
        self.ranking.check("registry.ranking", &needed.ranking)?;
        self.room_ranking
            .check("registry.room_ranking", &needed.ranking)
    }
}

#[cfg(feature = "alloc")]
impl RegistryStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &RegistrySizes) -> Self {
        use crate::managed::filled;
        Self {
            members: TableStorage::owned(sizes.members.records, false),
            sessions: filled(sizes.member_index, 0),
            endpoints: filled(sizes.member_index, 0),
            ranking: HeapStorage::owned(&sizes.ranking),
            room_ranking: HeapStorage::owned(&sizes.ranking),
        }
    }
}

impl<'s> Registry<'s> {
    /// The registry over `s` for a pipeline of `roles` roles: rankings too
    /// small for its members are refused as such, before any other length.
    pub(super) fn new(
        s: RegistryStorage<'s>,
        key: HashKey,
        roles: usize,
    ) -> Result<Self, ConfigError> {
        let members_ranked = s.ranking.places.len().min(s.room_ranking.places.len());
        let lanes = s.ranking.entries.len().min(s.room_ranking.entries.len());
        if members_ranked == 0 || lanes < members_ranked * roles {
            return Err(ConfigError::RankingTooSmall);
        }
        if s.members.records.len() > members_ranked {
            return Err(ConfigError::RankingTooSmall);
        }
        s.check(&RegistryStorage::storage_needed(&s.limits()))
            .map_err(ConfigError::Storage)?;
        Ok(Self {
            members: Table::new(s.members, key, false),
            sessions: Index::new(s.sessions),
            endpoints: Index::new(s.endpoints),
            ranking: Heaps::new(s.ranking),
            room_ranking: Heaps::new(s.room_ranking),
            slot_bounds: [(u64::MAX, 0); MAX_ROLES],
            picks: 0,
            prealloc_taken: 0,
        })
    }
}
