//! The instance's receive and send room: the pool's allocator, and the
//! preallocated slots carved from it at start, with who uses each, their
//! index by offset, and the deadlines of those held for a refusal.

use super::*;

/// The pool and its preallocated slots.
#[derive(Debug)]
pub(super) struct Slots<'s> {
    /// The pool's allocator.
    pub(super) pool: Buddy<'s>,
    /// The preallocated slots, as registered.
    pub(super) prealloc: ManagedSlice<'s, PreallocatedSlot>,
    /// Who uses each.
    pub(super) uses: ManagedSlice<'s, PreallocUse>,
    /// The preallocated slots by offset.
    index: Index<'s>,
    /// When each slot held for a refusal is let go.
    pub(super) timers: Heaps<'s>,
    /// Preallocated slots not free.
    pub(super) busy: usize,
    key: HashKey,
}

/// The slots' storage.
pub struct SlotsStorage<'s> {
    /// The pool allocator's tree (see [`Buddy::storage_needed`]).
    pub tree: ManagedSlice<'s, u8>,
    /// The pool allocator's generations.
    pub generations: ManagedSlice<'s, u32>,
    /// Preallocated receive slots (as many as `InstanceConfig::prealloc`).
    pub prealloc: ManagedSlice<'s, PreallocatedSlot>,
    /// Who uses each preallocated slot.
    pub prealloc_use: ManagedSlice<'s, PreallocUse>,
    /// The preallocated slots by offset.
    pub prealloc_index: ManagedSlice<'s, u64>,
    /// Deadlines of preallocated slots held for a refusal: one lane, a
    /// place per preallocated slot.
    pub prealloc_timers: HeapStorage<'s>,
}

/// The lengths of a [`SlotsStorage`]'s slices
/// ([`SlotsStorage::storage_needed`]); a length named here for several
/// fields is each one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotsSizes {
    /// `tree`.
    pub tree: usize,
    /// `generations`.
    pub generations: usize,
    /// `prealloc`, `prealloc_use`, and `prealloc_timers`' entries and
    /// places: one per preallocated slot.
    pub prealloc: usize,
    /// `prealloc_index`.
    pub prealloc_index: usize,
}

impl SlotsStorage<'_> {
    /// The lengths for a pool of `pool` with `prealloc` preallocated slots.
    pub fn storage_needed(pool: &BuddyConfig, prealloc: usize) -> Result<SlotsSizes, BuddyError> {
        let (tree, generations) = Buddy::storage_needed(pool)?;
        Ok(SlotsSizes {
            tree,
            generations,
            prealloc,
            prealloc_index: Index::places_for(prealloc),
        })
    }

    /// Refuses slices other than `needed` long, naming the first.
    pub fn check(&self, needed: &SlotsSizes) -> Result<(), StorageError> {
        let n = needed.prealloc;
        StorageError::check_each(
            "slots",
            [
                ("tree", needed.tree, self.tree.len()),
                ("generations", needed.generations, self.generations.len()),
                ("prealloc", n, self.prealloc.len()),
                ("prealloc_use", n, self.prealloc_use.len()),
                (
                    "prealloc_index",
                    needed.prealloc_index,
                    self.prealloc_index.len(),
                ),
            ],
        )?;
        self.prealloc_timers
            .check("slots.prealloc_timers", &HeapSizes::new(1, n))
    }
}

#[cfg(feature = "alloc")]
impl SlotsStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &SlotsSizes) -> Self {
        use crate::managed::filled;
        let none = PreallocatedSlot {
            offset: 0,
            size: 0,
            slot_id: 0,
            addr: 0,
        };
        Self {
            tree: filled(sizes.tree, 0),
            generations: filled(sizes.generations, 0),
            prealloc: filled(sizes.prealloc, none),
            prealloc_use: filled(sizes.prealloc, PreallocUse::FREE),
            prealloc_index: filled(sizes.prealloc_index, 0),
            prealloc_timers: HeapStorage::owned(&HeapSizes::new(1, sizes.prealloc)),
        }
    }
}

impl<'s> Slots<'s> {
    /// The pool `pool` at `pool_ptr`, free but for `prealloc`'s slots, held
    /// for the instance's lifetime.
    pub(super) fn new(
        s: SlotsStorage<'s>,
        pool: BuddyConfig,
        prealloc: Prealloc,
        pool_ptr: u64,
        key: HashKey,
    ) -> Result<Self, InstanceError> {
        let Prealloc { count, size } = prealloc;
        // Every slice of another length than this needs is refused by
        // name, the preallocated slots' included.
        let needed = SlotsStorage::storage_needed(&pool, count).map_err(InstanceError::Config)?;
        s.check(&needed).map_err(InstanceError::Storage)?;
        let SlotsStorage {
            tree,
            generations,
            prealloc: mut slots,
            prealloc_use: mut uses,
            prealloc_index,
            prealloc_timers,
        } = s;
        let mut buddy = Buddy::new(pool, tree, generations).map_err(InstanceError::Config)?;
        for (i, slot) in slots.iter_mut().enumerate() {
            // Held for the instance's lifetime: the handle is not kept.
            let h = buddy.allocate(size).map_err(InstanceError::Prealloc)?;
            *slot = PreallocatedSlot {
                offset: h.offset(),
                size: h.size(),
                slot_id: i as u64,
                addr: pool_ptr + h.offset(),
            };
        }
        uses.iter_mut().for_each(|u| *u = PreallocUse::FREE);
        let mut index = Index::new(prealloc_index);
        for (p, slot) in slots.iter().enumerate() {
            // Offsets are distinct, and the key is the machine's own.
            if index.insert(key.number(slot.offset, NS_OFFSET), p).is_err() {
                return Err(InstanceError::PreallocStorage { needed: count });
            }
        }
        Ok(Self {
            pool: buddy,
            prealloc: slots,
            uses,
            index,
            timers: Heaps::new(prealloc_timers),
            busy: 0,
            key,
        })
    }

    /// The preallocated slot at `offset`.
    pub(super) fn at(&self, offset: u64) -> Option<usize> {
        let hash = self.key.number(offset, NS_OFFSET);
        self.index.find(hash, |p| {
            self.prealloc.get(p).is_some_and(|s| s.offset == offset)
        })
    }

    /// Places the index read so far.
    pub(super) fn probes(&self) -> u64 {
        self.index.probes()
    }

    /// Sets what holds preallocated slot `p`, keeping the count of slots
    /// in use and the refusals' deadlines.
    pub(super) fn set_use(&mut self, p: usize, u: PreallocUse) {
        let Some(slot) = self.uses.get_mut(p) else {
            return;
        };
        let was_busy = !slot.is_free();
        *slot = u;
        self.busy = (self.busy + usize::from(!u.is_free())).saturating_sub(usize::from(was_busy));
        match u.0 {
            Use::Refused { until, .. } => self.timers.set(0, p, until.as_nanos()),
            _ => self.timers.remove(p),
        }
    }

    /// Frees what a request held: pool slots to the allocator, preallocated
    /// slots back to the table.
    pub(super) fn free_held(&mut self, held: Held) {
        match held {
            Held::Pool(h) => {
                // The handle came from this pool and is freed once.
                let _ = self.pool.free(h);
            }
            Held::Prealloc(i) => self.set_use(i, PreallocUse::FREE),
        }
    }

    /// The pool range `held` covers.
    pub(super) fn range(&self, held: &Held) -> Option<PoolRange> {
        match held {
            Held::Pool(h) => Some(PoolRange::new(h.offset(), h.size())),
            Held::Prealloc(i) => self
                .prealloc
                .get(*i)
                .map(|s| PoolRange::new(s.offset, s.size)),
        }
    }
}
