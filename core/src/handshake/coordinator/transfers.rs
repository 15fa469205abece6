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

/// The transfers' storage: a record per request in flight with its
/// share of nested bytes (the queues are linked through the records).
pub type TransfersStorage<'s> = RequestsStorage<'s, Transfer>;

/// The lengths of a [`TransfersStorage`]'s slices.
pub type TransfersSizes = RequestsSizes;

impl<'s> Transfers<'s> {
    pub(super) fn new(s: TransfersStorage<'s>, key: HashKey) -> Result<Self, ConfigError> {
        if s.requests.records.is_empty() {
            return Err(ConfigError::NoTransfers);
        }
        let needed = TransfersStorage::storage_needed(&s.limits(Limits::COORDINATOR));
        s.check("transfers", "transfers.requests", &needed)
            .map_err(ConfigError::Storage)?;
        let chunk = s.chunk();
        let records = Table::new(s.requests, key, true);
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
