//! The storage the machines' parts are made of, beside their tables: the
//! requests both keep (a timed table with one record per request in
//! flight, and a byte table split evenly among the records for each one's
//! manifest and scalar fields: the coordinator's transfers, the instance's
//! requests), their tombstones (the coordinator's ended legs, the
//! instance's ended requests) and heaps (the coordinator's rankings, the
//! instance's timers of held preallocated slots).

use super::common::Tombstone;
use super::limits::{Limits, StorageError};
use super::tables::index::Index;
use super::tables::HeapEntry;
use super::tables::{TableSizes, TableStorage};
use crate::managed::ManagedSlice;

/// Requests in flight, each with an equal share of nested JSON bytes.
pub struct RequestsStorage<'s, T> {
    /// One record per request in flight, with deadlines.
    pub requests: TableStorage<'s, T>,
    /// Manifest and scalar-field bytes, split evenly among `requests`.
    pub nested: ManagedSlice<'s, u8>,
}

/// The lengths of a [`RequestsStorage`]'s slices
/// ([`RequestsStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestsSizes {
    /// `requests`.
    pub requests: TableSizes,
    /// `nested`.
    pub nested: usize,
}

impl<T> RequestsStorage<'_, T> {
    /// The lengths for `limits`: `requests` in flight (at least one), each
    /// with `nested_per_request` bytes of nested JSON.
    pub fn storage_needed(limits: &Limits) -> RequestsSizes {
        let n = limits.requests.max(1);
        RequestsSizes {
            requests: TableStorage::<T>::storage_needed(n, true),
            nested: n * limits.nested_per_request,
        }
    }

    /// `base` with the requests these slices hold and the nested bytes
    /// each gets.
    pub fn limits(&self, base: Limits) -> Limits {
        let requests = self.requests.records.len();
        Limits {
            requests,
            nested_per_request: self.nested.len() / requests.max(1),
            ..base
        }
    }

    /// The nested bytes each request gets.
    pub(crate) fn chunk(&self) -> usize {
        self.nested.len() / self.requests.records.len().max(1)
    }

    /// Refuses slices other than `needed` long, naming the first: the
    /// table's as `table` (`transfers.requests`), `nested` as `part`'s.
    pub fn check(
        &self,
        part: &'static str,
        table: &'static str,
        needed: &RequestsSizes,
    ) -> Result<(), StorageError> {
        self.requests.check(table, &needed.requests)?;
        StorageError::check(part, "nested", needed.nested, self.nested.len())
    }
}

#[cfg(feature = "alloc")]
impl<T> RequestsStorage<'static, T> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &RequestsSizes) -> Self {
        Self {
            requests: TableStorage::owned(sizes.requests.records, true),
            nested: crate::managed::filled(sizes.nested, 0),
        }
    }
}

/// The storage of a machine's tombstones: the ring and its index.
pub struct GraveyardStorage<'s> {
    /// The tombstones, newest overwriting oldest. Request ids must not be
    /// reused while they are here.
    pub stones: ManagedSlice<'s, Tombstone>,
    /// Their index, by the hash of id and leg.
    pub index: ManagedSlice<'s, u64>,
}

/// The lengths of a [`GraveyardStorage`]'s slices
/// ([`GraveyardStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraveyardSizes {
    /// `stones`: how many tombstones are remembered.
    pub stones: usize,
    /// `index`.
    pub index: usize,
}

impl GraveyardStorage<'_> {
    /// The lengths for `tombstones` tombstones (at least one).
    pub fn storage_needed(tombstones: usize) -> GraveyardSizes {
        let stones = tombstones.max(1);
        GraveyardSizes {
            stones,
            index: Index::places_for(stones),
        }
    }

    /// Refuses slices other than `needed` long, naming the first as
    /// `part`'s (`remains.finished.index`).
    pub fn check(&self, part: &'static str, needed: &GraveyardSizes) -> Result<(), StorageError> {
        StorageError::check_each(
            part,
            [
                ("stones", needed.stones, self.stones.len()),
                ("index", needed.index, self.index.len()),
            ],
        )
    }
}

#[cfg(feature = "alloc")]
impl GraveyardStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &GraveyardSizes) -> Self {
        use crate::managed::filled;
        Self {
            stones: filled(sizes.stones, Tombstone::EMPTY),
            index: filled(sizes.index, 0),
        }
    }
}

/// The storage of heaps: every lane's entries, and each id's place.
pub struct HeapStorage<'s> {
    /// The lanes' entries: as many lanes as it holds `places.len()`
    /// entries each.
    pub entries: ManagedSlice<'s, HeapEntry>,
    /// One per id.
    pub places: ManagedSlice<'s, u64>,
}

/// The lengths of a [`HeapStorage`]'s slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeapSizes {
    /// `entries`.
    pub entries: usize,
    /// `places`.
    pub places: usize,
}

impl HeapSizes {
    /// The lengths for `lanes` lanes of `ids` ids.
    pub const fn new(lanes: usize, ids: usize) -> Self {
        Self {
            entries: lanes * ids,
            places: ids,
        }
    }
}

impl HeapStorage<'_> {
    /// Refuses slices other than `needed` long, naming the first as
    /// `part`'s (`registry.ranking.places`).
    pub fn check(&self, part: &'static str, needed: &HeapSizes) -> Result<(), StorageError> {
        StorageError::check_each(
            part,
            [
                ("entries", needed.entries, self.entries.len()),
                ("places", needed.places, self.places.len()),
            ],
        )
    }
}

#[cfg(feature = "alloc")]
impl HeapStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &HeapSizes) -> Self {
        use crate::managed::filled;
        Self {
            entries: filled(sizes.entries, (0, 0)),
            places: filled(sizes.places, 0),
        }
    }
}
