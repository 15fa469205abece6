//! The requests in flight: one transfer record per leg with its nested
//! JSON, and per sending role the queue of those waiting for a receiver
//! (linked through the records, see `queue.rs`).

use super::*;

/// The transfers and their queues.
#[derive(Debug)]
pub(super) struct Transfers<'s> {
    /// One per request in flight, with deadlines.
    pub(super) records: Table<'s, Transfer>,
    /// Each transfer's manifest and scalar fields: `chunk` bytes at its
    /// table index.
    nested: ManagedSlice<'s, u8>,
    chunk: usize,
    /// Per sending role: the first and last transfer waiting for a
    /// receiver, linked through the records.
    pub(super) queues: [(u32, u32); MAX_ROLES],
    /// The last transfer's sequence number.
    seq: u64,
}

/// The transfers' storage.
pub struct TransfersStorage<'s> {
    /// One per request in flight, with deadlines.
    pub requests: TableStorage<'s, Transfer>,
    /// Manifest and scalar-field bytes, split evenly among `requests`.
    pub nested: ManagedSlice<'s, u8>,
}

/// The lengths of a [`TransfersStorage`]'s slices
/// ([`TransfersStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransfersSizes {
    /// `requests`.
    pub requests: TableSizes,
    /// `nested`.
    pub nested: usize,
}

impl TransfersStorage<'_> {
    /// The lengths for `limits`: `requests` in flight, each with
    /// `nested_per_request` bytes of nested JSON.
    pub fn storage_needed(limits: &Limits) -> TransfersSizes {
        let n = limits.requests.max(1);
        TransfersSizes {
            requests: TableStorage::<Transfer>::storage_needed(n, true),
            nested: n * limits.nested_per_request,
        }
    }

    /// The limits these slices were sized for: the requests they hold,
    /// and the nested bytes each gets.
    pub fn limits(&self) -> Limits {
        let requests = self.requests.records.len();
        Limits {
            requests,
            nested_per_request: self.nested.len() / requests.max(1),
            ..Limits::COORDINATOR
        }
    }

    /// Refuses slices other than `needed` long, naming the first.
    pub fn check(&self, needed: &TransfersSizes) -> Result<(), StorageError> {
        self.requests
            .check("transfers.requests", &needed.requests)?;
        StorageError::check("transfers", "nested", needed.nested, self.nested.len())
    }
}

#[cfg(feature = "alloc")]
impl TransfersStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &TransfersSizes) -> Self {
        use crate::managed::filled;
        Self {
            requests: TableStorage::owned(sizes.requests.records, true),
            nested: filled(sizes.nested, 0),
        }
    }
}

impl<'s> Transfers<'s> {
    pub(super) fn new(s: TransfersStorage<'s>, key: HashKey) -> Result<Self, ConfigError> {
        if s.requests.records.is_empty() {
            return Err(ConfigError::NoTransfers);
        }
        s.check(&TransfersStorage::storage_needed(&s.limits()))
            .map_err(ConfigError::Storage)?;
        let records = Table::new(s.requests, key, true);
        let chunk = s.nested.len() / records.capacity().max(1);
        Ok(Self {
            records,
            nested: s.nested,
            chunk,
            queues: [(NONE, NONE); MAX_ROLES],
            seq: 0,
        })
    }

    /// Keeps `manifest` and `scalars` as the nested JSON of the transfer
    /// to be put at `index`. False if they do not fit its share.
    pub(super) fn keep_nested(&mut self, index: usize, manifest: &str, scalars: &str) -> bool {
        let base = index * self.chunk;
        let total = manifest.len() + scalars.len();
        let Some(dst) = self
            .nested
            .get_mut(base..base + total)
            .filter(|_| total <= self.chunk)
        else {
            return false;
        };
        dst[..manifest.len()].copy_from_slice(manifest.as_bytes());
        dst[manifest.len()..].copy_from_slice(scalars.as_bytes());
        true
    }

    /// The nested JSON of transfer `t`, at `index`.
    pub(super) fn nested_of(&self, index: usize, t: &Transfer) -> (RawJson<'_>, RawJson<'_>) {
        nested_json(
            &self.nested,
            index * self.chunk,
            t.manifest_len,
            t.scalars_len,
        )
    }

    /// The sequence number of the next transfer.
    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}
