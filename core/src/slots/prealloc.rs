//! A receiver's preallocated receive slots, as the coordinator tracks them:
//! taken first-fit for a transfer, given back at their original size.
//!
//! (The seed's coordinator records a recycled slot at the size of the
//! transfer that used it, so slots shrink over time; here they never do.)

use core::fmt;

use crate::wire::{DecodeError, PreallocatedSlot, SlotList};

/// Why a slot could not be added, taken or given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreallocError {
    /// The table holds its capacity already.
    TableFull {
        /// The table's capacity.
        capacity: usize,
    },
    /// Two slots share an id.
    DuplicateId {
        /// The id.
        slot_id: u64,
    },
    /// A slot is empty, reaches past the pool, or its address is not
    /// `pool_ptr + offset`.
    OutsidePool {
        /// The slot.
        slot_id: u64,
    },
    /// Two slots overlap.
    Overlap {
        /// One of them.
        slot_id: u64,
        /// The other.
        other: u64,
    },
    /// No slot has that id.
    UnknownSlot {
        /// The id.
        slot_id: u64,
    },
    /// The slot is not taken (given back twice?).
    NotTaken {
        /// The id.
        slot_id: u64,
    },
    /// The registration's slot list is malformed.
    Malformed(DecodeError),
}

impl fmt::Display for PreallocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TableFull { capacity } => write!(f, "more than {capacity} preallocated slots"),
            Self::DuplicateId { slot_id } => write!(f, "preallocated slot id {slot_id} given twice"),
            Self::OutsidePool { slot_id } => write!(
                f,
                "preallocated slot {slot_id} is empty, past the pool end, or its addr is not pool_ptr + offset"
            ),
            Self::Overlap { slot_id, other } => {
                write!(f, "preallocated slots {slot_id} and {other} overlap")
            }
            Self::UnknownSlot { slot_id } => write!(f, "no preallocated slot {slot_id}"),
            Self::NotTaken { slot_id } => write!(f, "preallocated slot {slot_id} is not taken"),
            Self::Malformed(e) => write!(f, "preallocated_slots: {e}"),
        }
    }
}

impl core::error::Error for PreallocError {}

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: PreallocatedSlot,
    taken: bool,
}

/// Up to `N` preallocated slots of one receiver.
#[derive(Clone, Debug)]
pub struct PreallocTable<const N: usize> {
    entries: [Option<Entry>; N],
    len: usize,
    taken: usize,
}

impl<const N: usize> Default for PreallocTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> PreallocTable<N> {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            entries: [None; N],
            len: 0,
            taken: 0,
        }
    }

    /// The slots a registration announces, checked against the pool they
    /// live in: non-empty, inside `[0, pool_size)`, `addr == pool_ptr +
    /// offset`, distinct ids, no overlaps. All or nothing.
    pub fn from_registration(
        slots: &SlotList<'_>,
        pool_ptr: u64,
        pool_size: u64,
    ) -> Result<Self, PreallocError> {
        let mut table = Self::new();
        for slot in slots.iter() {
            let slot = slot.map_err(PreallocError::Malformed)?;
            let end = slot.offset.checked_add(slot.size);
            let addr = pool_ptr.checked_add(slot.offset);
            if slot.size == 0 || end.is_none_or(|e| e > pool_size) || addr != Some(slot.addr) {
                return Err(PreallocError::OutsidePool {
                    slot_id: slot.slot_id,
                });
            }
            if let Some(other) = table
                .iter()
                .find(|o| o.offset < slot.offset + slot.size && slot.offset < o.offset + o.size)
            {
                return Err(PreallocError::Overlap {
                    slot_id: slot.slot_id,
                    other: other.slot_id,
                });
            }
            table.insert(slot)?;
        }
        Ok(table)
    }

    /// Adds a free slot.
    pub fn insert(&mut self, slot: PreallocatedSlot) -> Result<(), PreallocError> {
        if self.iter().any(|s| s.slot_id == slot.slot_id) {
            return Err(PreallocError::DuplicateId {
                slot_id: slot.slot_id,
            });
        }
        let free = self
            .entries
            .iter_mut()
            .find(|e| e.is_none())
            .ok_or(PreallocError::TableFull { capacity: N })?;
        *free = Some(Entry { slot, taken: false });
        self.len += 1;
        Ok(())
    }

    /// Takes the first free slot (in insertion order) of at least `size`
    /// bytes.
    pub fn take(&mut self, size: u64) -> Option<PreallocatedSlot> {
        let e = self
            .entries
            .iter_mut()
            .flatten()
            .find(|e| !e.taken && e.slot.size >= size)?;
        e.taken = true;
        self.taken += 1;
        Some(e.slot)
    }

    /// Gives a taken slot back, whole.
    pub fn give_back(&mut self, slot_id: u64) -> Result<PreallocatedSlot, PreallocError> {
        let e = self
            .entries
            .iter_mut()
            .flatten()
            .find(|e| e.slot.slot_id == slot_id)
            .ok_or(PreallocError::UnknownSlot { slot_id })?;
        if !e.taken {
            return Err(PreallocError::NotTaken { slot_id });
        }
        e.taken = false;
        self.taken -= 1;
        Ok(e.slot)
    }

    /// The slot with that id, if any, and whether it is taken.
    pub fn get(&self, slot_id: u64) -> Option<(PreallocatedSlot, bool)> {
        self.entries
            .iter()
            .flatten()
            .find(|e| e.slot.slot_id == slot_id)
            .map(|e| (e.slot, e.taken))
    }

    /// Every slot, taken or not, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = PreallocatedSlot> + '_ {
        self.entries.iter().flatten().map(|e| e.slot)
    }

    /// Slots in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the table has no slots.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots not taken.
    pub fn free(&self) -> usize {
        self.len - self.taken
    }

    /// Free slots of at least `size` bytes.
    pub fn free_fitting(&self, size: u64) -> usize {
        self.entries
            .iter()
            .flatten()
            .filter(|e| !e.taken && e.slot.size >= size)
            .count()
    }

    /// Empties the table (a receiver registered again with new slots).
    pub fn clear(&mut self) {
        *self = Self::new();
    }
}
