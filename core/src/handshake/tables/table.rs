//! A table of records in storage of fixed size, with what makes every
//! per-message operation on it O(1) (or O(log n) for time): a stack of
//! free places, an index by the hash of each record's key, a heap of the
//! records' deadlines, and counts of records by class.

use core::ops::{Deref, DerefMut};

use super::hash::HashKey;
use super::heap::{HeapEntry, Heaps};
use super::index::Index;
use crate::handshake::HeapStorage;
use crate::handshake::{Instant, StorageError};
use crate::managed::ManagedSlice;

/// Classes a table counts its records by.
pub(crate) const CLASSES: usize = 5;

/// What a table needs to know of a record.
pub(crate) trait Record {
    /// The hash of the key it is found by; it never changes while the
    /// record is in the table.
    fn key_hash(&self, key: &HashKey) -> u64;

    /// When the record is due, if ever.
    fn due(&self) -> Option<Instant> {
        None
    }

    /// The class it is counted in (below [`CLASSES`]).
    fn class(&self) -> usize {
        0
    }
}

/// A table's storage: the caller's (`(&mut slice).into()` each) or, with
/// the `alloc` feature, its own (`TableStorage::owned`).
pub struct TableStorage<'s, T> {
    /// The records.
    pub records: ManagedSlice<'s, Option<T>>,
    /// The free places: as many as records.
    pub free: ManagedSlice<'s, u32>,
    /// The hash index: at least twice as many places as records, a power of
    /// two ([`TableStorage::index_places`]).
    pub index: ManagedSlice<'s, u64>,
    /// What each place is indexed under: as many as records.
    pub hashes: ManagedSlice<'s, u64>,
    /// The deadline heap: as many as records for a table whose records
    /// time out (the transfers, parked slots, requests and arrivals), else
    /// empty.
    pub timers: ManagedSlice<'s, HeapEntry>,
    /// The heap's places: as many as `timers`.
    pub timer_places: ManagedSlice<'s, u64>,
}

impl<T> TableStorage<'_, T> {
    /// Index places for a table of `records`.
    pub fn index_places(records: usize) -> usize {
        Index::places_for(records)
    }

    /// The lengths a table of `records` records needs, with deadline
    /// heaps if `timed`.
    pub fn storage_needed(records: usize, timed: bool) -> TableSizes {
        TableSizes {
            records,
            index: Index::places_for(records),
            timers: if timed { records } else { 0 },
        }
    }
}

impl<T> TableStorage<'_, T> {
    /// The lengths given.
    pub fn sizes(&self) -> TableSizes {
        TableSizes {
            records: self.records.len(),
            index: self.index.len(),
            timers: self.timers.len(),
        }
    }

    /// Refuses slices other than `needed` long, naming the first (the
    /// error's `part` is `part`, this table's name in its machine).
    pub fn check(&self, part: &'static str, needed: &TableSizes) -> Result<(), StorageError> {
        StorageError::check(part, "records", needed.records, self.records.len())?;
        StorageError::check(part, "free", needed.records, self.free.len())?;
        StorageError::check(part, "hashes", needed.records, self.hashes.len())?;
        StorageError::check(part, "index", needed.index, self.index.len())?;
        StorageError::check(part, "timers", needed.timers, self.timers.len())?;
        StorageError::check(part, "timer_places", needed.timers, self.timer_places.len())
    }
}

/// The lengths of a [`TableStorage`]'s slices
/// ([`TableStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TableSizes {
    /// `records`, `free` and `hashes`.
    pub records: usize,
    /// `index`.
    pub index: usize,
    /// `timers` and `timer_places` (zero for an untimed table).
    pub timers: usize,
}

#[cfg(feature = "alloc")]
impl<T> TableStorage<'static, T> {
    /// Storage of its own for `records` records, with deadline heaps if
    /// `timed`.
    pub fn owned(records: usize, timed: bool) -> Self {
        use crate::managed::{empty, filled};
        let n = Self::storage_needed(records, timed);
        Self {
            records: empty(n.records),
            free: filled(n.records, 0),
            index: filled(n.index, 0),
            hashes: filled(n.records, 0),
            timers: filled(n.timers, (0, 0)),
            timer_places: filled(n.timers, 0),
        }
    }
}

/// The table.
#[derive(Debug)]
pub(crate) struct Table<'s, T> {
    records: ManagedSlice<'s, Option<T>>,
    free: ManagedSlice<'s, u32>,
    free_len: usize,
    index: Index<'s>,
    /// Per place: the hash its index entry is under, with the low bit set
    /// (the index reads only the high half), or 0 if it has none. An entry
    /// stays after its record is removed (lookups check the record), until
    /// the place takes a record of another key: so a record put back after
    /// a change never needs a new place in the index.
    indexed: ManagedSlice<'s, u64>,
    timers: Heaps<'s>,
    key: HashKey,
    live: usize,
    tally: [usize; CLASSES],
    /// A record could not be indexed when it was put back (see
    /// [`Table::put`]): lookups read the whole table from then on.
    scan: bool,
}

impl<'s, T: Record> Table<'s, T> {
    /// An empty table. Records beyond what `free` can list, beyond what
    /// the deadline heap holds (if `timed`: its records time out), or
    /// beyond 2^32 are not used; an index smaller than
    /// [`TableStorage::index_places`] fills, and refuses inserts, sooner.
    pub(crate) fn new(s: TableStorage<'s, T>, key: HashKey, timed: bool) -> Self {
        // Index entries hold a place in 32 bits, two values reserved.
        let mut n = s.records.len().min(s.free.len()).min(s.hashes.len());
        n = n.min(u32::MAX as usize - 2);
        if timed {
            n = n.min(s.timers.len()).min(s.timer_places.len());
        }
        let mut records = s.records.truncated(n);
        let mut indexed = s.hashes;
        indexed.iter_mut().for_each(|h| *h = 0);
        records.iter_mut().for_each(|r| *r = None);
        let mut free = s.free;
        // Popped from the end: place 0 is taken first.
        for (i, f) in free.iter_mut().take(n).enumerate() {
            *f = (n - 1 - i) as u32;
        }
        Self {
            records,
            free,
            free_len: n,
            index: Index::new(s.index),
            indexed,
            timers: Heaps::new(HeapStorage {
                entries: s.timers,
                places: s.timer_places,
            }),
            key,
            live: 0,
            tally: [0; CLASSES],
            scan: false,
        }
    }

    /// The hash key.
    pub(crate) fn key(&self) -> &HashKey {
        &self.key
    }

    /// Places in the table.
    pub(crate) fn capacity(&self) -> usize {
        self.records.len()
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// True if no place is free.
    pub(crate) fn is_full(&self) -> bool {
        self.free_len == 0
    }

    /// The place the next [`insert`](Self::insert) takes, if any is free.
    pub(crate) fn next_free(&self) -> Option<usize> {
        self.free_len
            .checked_sub(1)
            .and_then(|k| self.free.get(k))
            .map(|&i| i as usize)
    }

    /// Records of `class`.
    pub(crate) fn tally(&self, class: usize) -> usize {
        self.tally.get(class).copied().unwrap_or(0)
    }

    /// Places the index read so far.
    pub(crate) fn probes(&self) -> u64 {
        self.index.probes()
    }

    /// The record at `i`.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.records.get(i)?.as_ref()
    }

    /// Every place, for what is not done per message.
    pub(crate) fn iter(&self) -> core::slice::Iter<'_, Option<T>> {
        self.records.iter()
    }

    /// The record at `i`, to change; its deadline and class are taken
    /// anew when the guard goes. Its key must not change.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<RecordMut<'_, 's, T>> {
        let Table {
            records,
            timers,
            tally,
            ..
        } = self;
        let record = records.get_mut(i)?.as_mut()?;
        let class = record.class();
        Some(RecordMut {
            record,
            timers,
            tally,
            index: i,
            class,
        })
    }

    /// The first record under `hash` that `is` accepts, and its place.
    pub(crate) fn find(&self, hash: u64, mut is: impl FnMut(&T) -> bool) -> Option<usize> {
        if self.scan {
            return self
                .records
                .iter()
                .position(|r| r.as_ref().is_some_and(&mut is));
        }
        self.index.find(hash, |i| {
            self.records
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(&mut is)
        })
    }

    /// Adds a record: its place, or the record back if the table is full
    /// (or, which a key the peers do not know makes as good as impossible,
    /// its key's probe sequence is).
    pub(crate) fn insert(&mut self, record: T) -> Result<usize, T> {
        if self.free_len == 0 {
            return Err(record);
        }
        let i = self.free[self.free_len - 1] as usize;
        if !self.index_at(i, record.key_hash(&self.key)) {
            return Err(record);
        }
        self.free_len -= 1;
        self.occupy(i, record);
        Ok(i)
    }

    /// Indexes place `i` under `hash` (dropping what it was indexed under
    /// before, if that differs); false if the probe sequence is full.
    fn index_at(&mut self, i: usize, hash: u64) -> bool {
        let hash = hash | 1;
        let Some(slot) = self.indexed.get_mut(i) else {
            return false;
        };
        match *slot {
            0 => {}
            h if h == hash => return true,
            h => {
                self.index.remove(h, i);
                *slot = 0;
            }
        }
        if self.scan || self.index.insert(hash, i).is_err() {
            return self.scan;
        }
        self.indexed[i] = hash;
        true
    }

    /// Takes the record at `i` out; its place is free. Its index entry
    /// stays until the place takes another key.
    pub(crate) fn remove(&mut self, i: usize) -> Option<T> {
        let record = self.records.get_mut(i)?.take()?;
        self.timers.remove(i);
        self.live -= 1;
        if let Some(t) = self.tally.get_mut(record.class()) {
            *t = t.saturating_sub(1);
        }
        if let Some(f) = self.free.get_mut(self.free_len) {
            *f = i as u32;
            self.free_len += 1;
        }
        Some(record)
    }

    /// Puts `record` at free place `i`: a record just [removed](Self::remove)
    /// from there, changed (its key the same, so its index entry is still
    /// there). Nothing happens if `i` is taken.
    pub(crate) fn put(&mut self, i: usize, record: T) {
        if self.records.get(i).is_none_or(Option::is_some) {
            return;
        }
        // The place is almost always the one freed last.
        let at = (0..self.free_len)
            .rev()
            .find(|&k| self.free[k] as usize == i);
        let Some(at) = at else {
            return;
        };
        self.free_len -= 1;
        self.free.swap(at, self.free_len);
        if !self.index_at(i, record.key_hash(&self.key)) {
            // Another key, and its probe sequence full (nothing in the
            // machines puts another key back): stay correct, if slower.
            self.scan = true;
        }
        self.occupy(i, record);
    }

    fn occupy(&mut self, i: usize, record: T) {
        if let Some(at) = record.due() {
            self.timers.set(0, i, at.as_nanos());
        }
        if let Some(t) = self.tally.get_mut(record.class()) {
            *t += 1;
        }
        self.live += 1;
        self.records[i] = Some(record);
    }

    /// The record due soonest: when, and its place.
    pub(crate) fn next_due(&self) -> Option<(Instant, usize)> {
        self.timers.peek(0).map(|(at, i)| (Instant(at), i))
    }
}

impl<T> core::ops::Index<usize> for Table<'_, T> {
    type Output = Option<T>;

    fn index(&self, i: usize) -> &Option<T> {
        &self.records[i]
    }
}

/// A record being changed: when it goes, the table takes the record's
/// deadline and class anew.
pub(crate) struct RecordMut<'a, 's, T: Record> {
    record: &'a mut T,
    timers: &'a mut Heaps<'s>,
    tally: &'a mut [usize; CLASSES],
    index: usize,
    class: usize,
}

impl<T: Record> Deref for RecordMut<'_, '_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.record
    }
}

impl<T: Record> DerefMut for RecordMut<'_, '_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.record
    }
}

impl<T: Record> Drop for RecordMut<'_, '_, T> {
    fn drop(&mut self) {
        match self.record.due() {
            Some(at) => self.timers.set(0, self.index, at.as_nanos()),
            None => self.timers.remove(self.index),
        }
        let class = self.record.class();
        if class != self.class {
            if let Some(t) = self.tally.get_mut(self.class) {
                *t = t.saturating_sub(1);
            }
            if let Some(t) = self.tally.get_mut(class) {
                *t += 1;
            }
        }
    }
}
