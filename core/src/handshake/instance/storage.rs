//! An instance's storage: each part's, in caller storage or (feature
//! `alloc`) its own. Each part says what it needs (`storage_needed`), and
//! the machine refuses storage of other lengths, naming the slice
//! ([`InstanceError::Storage`]).

use super::*;

/// Caller-owned storage of an instance: its parts'.
pub struct InstanceStorage<'s> {
    /// The pool and its preallocated slots.
    pub slots: SlotsStorage<'s>,
    /// The requests, and what finds them.
    pub transfers: TransfersStorage<'s>,
    /// The queues the caller polls.
    pub outbox: OutboxStorage<'s>,
    /// The key of every index (see [`HashKey`]).
    pub hash_key: HashKey,
}

/// The lengths of an [`InstanceStorage`]'s slices, part by part
/// ([`InstanceStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InstanceSizes {
    /// The slots' ([`SlotsStorage::storage_needed`]).
    pub slots: SlotsSizes,
    /// The transfers' ([`TransfersStorage::storage_needed`]).
    pub transfers: TransfersSizes,
    /// The outbox's ([`OutboxStorage::storage_needed`]).
    pub outbox: OutboxSizes,
}

impl InstanceStorage<'_> {
    /// The lengths of the tables an instance needs for `limits`
    /// (`requests` in flight, each with `nested_per_request` bytes of
    /// nested JSON, `tombstones` ended requests), a pool of `pool` with
    /// `prealloc` preallocated slots, and queues that are never full:
    /// what `owned` allocates, and what a caller
    /// that places the tables itself gives.
    pub fn storage_needed(
        limits: &Limits,
        pool: &BuddyConfig,
        prealloc: usize,
    ) -> Result<InstanceSizes, BuddyError> {
        Ok(InstanceSizes {
            slots: SlotsStorage::storage_needed(pool, prealloc)?,
            transfers: TransfersStorage::storage_needed(limits),
            outbox: OutboxStorage::storage_needed(limits),
        })
    }
}

#[cfg(feature = "alloc")]
impl InstanceStorage<'static> {
    /// Tables of their own, sized by
    /// [`storage_needed`](InstanceStorage::storage_needed).
    pub fn owned(limits: &Limits, pool: &BuddyConfig, prealloc: usize) -> Result<Self, BuddyError> {
        let n = Self::storage_needed(limits, pool, prealloc)?;
        Ok(Self {
            slots: SlotsStorage::owned(&n.slots),
            transfers: TransfersStorage::owned(&n.transfers),
            outbox: OutboxStorage::owned(&n.outbox),
            hash_key: crate::handshake::tables::default_key(),
        })
    }
}
