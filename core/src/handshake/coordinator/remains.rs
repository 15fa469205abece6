//! What is left of requests that ended: preallocated slots parked until
//! no write can land in them any more, and the tombstones of ended legs
//! that tell a late duplicate from a new request.

use super::*;

/// The parked slots and the tombstones.
#[derive(Debug)]
pub(super) struct Remains<'s> {
    /// Preallocated slots out of use, with deadlines.
    pub(super) parked: Table<'s, Parked>,
    /// Legs of requests that ended, newest overwriting oldest.
    pub(super) finished: Graveyard<'s>,
}

/// The storage of what is left of ended requests.
pub struct RemainsStorage<'s> {
    /// Preallocated slots out of use, with deadlines: one per request in
    /// flight and `prealloc_per_member` per member.
    pub parked: TableStorage<'s, Parked>,
    /// Legs of requests that ended, newest overwriting oldest, so that a
    /// duplicated `transfer_staged` arriving late is not taken for a new
    /// request.
    pub finished: GraveyardStorage<'s>,
}

/// The lengths of a [`RemainsStorage`]'s slices
/// ([`RemainsStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemainsSizes {
    /// `parked`.
    pub parked: TableSizes,
    /// `finished`.
    pub finished: GraveyardSizes,
}

impl RemainsStorage<'_> {
    /// The lengths for `limits`: a parked slot for each of `requests` and
    /// `prealloc_per_member` (at most [`MAX_PREALLOC_PER_MEMBER`]) for each
    /// of `members`, and `tombstones` ended legs.
    pub fn storage_needed(limits: &Limits) -> RemainsSizes {
        let n = limits.requests.max(1);
        let members = limits.members.max(1);
        let per_member = limits.prealloc_per_member.min(MAX_PREALLOC_PER_MEMBER);
        RemainsSizes {
            parked: TableStorage::<Parked>::storage_needed(n + members * per_member, true),
            finished: GraveyardStorage::storage_needed(limits.tombstones),
        }
    }

    /// The tombstones these slices were sized for; how many slots they
    /// park follows from the coordinator's requests and members, which
    /// its other parts hold.
    pub fn limits(&self) -> Limits {
        Limits {
            tombstones: self.finished.stones.len(),
            ..Limits::COORDINATOR
        }
    }

    /// Refuses slices other than `needed` long, naming the first.
    pub fn check(&self, needed: &RemainsSizes) -> Result<(), StorageError> {
        self.parked.check("remains.parked", &needed.parked)?;
        self.finished.check("remains.finished", &needed.finished)
    }
}

#[cfg(feature = "alloc")]
impl RemainsStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &RemainsSizes) -> Self {
        Self {
            parked: TableStorage::owned(sizes.parked.records, true),
            finished: GraveyardStorage::owned(&sizes.finished),
        }
    }
}

impl<'s> Remains<'s> {
    /// Over `s`, sized for `limits` (the coordinator's requests, members
    /// and preallocated slots per member).
    pub(super) fn new(
        s: RemainsStorage<'s>,
        key: HashKey,
        limits: &Limits,
    ) -> Result<Self, ConfigError> {
        s.check(&RemainsStorage::storage_needed(limits))
            .map_err(ConfigError::Storage)?;
        Ok(Self {
            parked: Table::new(s.parked, key, true),
            finished: Graveyard::new(s.finished, key),
        })
    }
}
