//! A power-of-two buddy allocator over the offsets of one pool.
//!
//! The pool is split into `pool_size / min_block` leaves under a complete
//! binary tree (over the next power of two of that count). Each node holds
//! one byte: the order of the largest free block in its subtree plus one
//! (0: nothing free), and a flag for "a slot is allocated exactly here".
//! Allocation walks down from the root to the leftmost block that fits and
//! frees walk up from the slot's node, so both are O(log(pool / min_block))
//! in the worst case, with no lists and no allocation. A pool that is not a
//! power of two is used whole: leaves past its end are never free.
//!
//! Each leaf also keeps the generation of the last slot that started there;
//! a [`SlotHandle`] carries it, so a stale handle (its slot was freed and the
//! offset handed out again) is told apart from the live one.

use core::fmt;

use crate::managed::ManagedSlice;

/// The flag bit of a node: a slot is allocated exactly at this node.
const ALLOCATED: u8 = 0x80;
/// The bits of a node that hold "largest free order + 1".
const LONGEST: u8 = 0x7f;

/// The shape of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuddyConfig {
    /// Bytes in the pool; a multiple of `min_block`.
    pub pool_size: u64,
    /// The smallest slot, a power of two (sglang uses 1 MiB).
    pub min_block: u64,
    /// Stamped into every handle, so that a handle of another pool is
    /// refused rather than freeing an unrelated slot.
    pub pool_id: u32,
}

/// Why an allocator could not be built, or an allocation or free failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuddyError {
    /// `min_block` is zero or not a power of two.
    MinBlockNotPowerOfTwo {
        /// The value given.
        min_block: u64,
    },
    /// The pool is empty or not a multiple of `min_block`.
    PoolNotMultipleOfMinBlock {
        /// The pool size given.
        pool_size: u64,
        /// The minimum block.
        min_block: u64,
    },
    /// The caller's storage is too small for this pool.
    StorageTooSmall {
        /// Tree bytes needed.
        tree_needed: usize,
        /// Generation words needed.
        generations_needed: usize,
    },
    /// A request for zero bytes.
    ZeroSize,
    /// More than the pool can ever hold (or a size that overflows when
    /// rounded up to a power of two).
    TooLarge {
        /// Bytes requested.
        requested: u64,
        /// The largest slot this pool can ever hand out.
        max_slot: u64,
    },
    /// No free block large enough right now.
    OutOfSpace {
        /// Bytes requested.
        requested: u64,
        /// The largest free block now.
        largest_free: u64,
    },
    /// The handle belongs to another pool.
    ForeignHandle {
        /// The handle's pool.
        handle_pool: u32,
        /// This pool.
        pool: u32,
    },
    /// The handle's offset and size describe no possible slot of this pool.
    InvalidHandle {
        /// The handle's offset.
        offset: u64,
        /// The handle's size.
        size: u64,
    },
    /// No slot of that size is allocated at that offset (freed already, or
    /// never allocated).
    NotAllocated {
        /// The handle's offset.
        offset: u64,
    },
    /// The slot at that offset was freed and allocated again since this
    /// handle was issued.
    StaleHandle {
        /// The handle's offset.
        offset: u64,
        /// The handle's generation.
        generation: u32,
        /// The live slot's generation.
        current: u32,
    },
}

impl fmt::Display for BuddyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::MinBlockNotPowerOfTwo { min_block } => {
                write!(f, "min_block {min_block} is not a power of two")
            }
            Self::PoolNotMultipleOfMinBlock {
                pool_size,
                min_block,
            } => write!(
                f,
                "pool size {pool_size} is not a positive multiple of min_block {min_block}"
            ),
            Self::StorageTooSmall {
                tree_needed,
                generations_needed,
            } => write!(
                f,
                "allocator storage too small: {tree_needed} tree bytes and \
                 {generations_needed} generation words needed"
            ),
            Self::ZeroSize => f.write_str("zero-size slot requested"),
            Self::TooLarge {
                requested,
                max_slot,
            } => {
                write!(
                    f,
                    "{requested} bytes requested, the pool's largest slot is {max_slot}"
                )
            }
            Self::OutOfSpace {
                requested,
                largest_free,
            } => write!(
                f,
                "no free block for {requested} bytes (largest free block {largest_free})"
            ),
            Self::ForeignHandle { handle_pool, pool } => {
                write!(f, "handle of pool {handle_pool} freed in pool {pool}")
            }
            Self::InvalidHandle { offset, size } => {
                write!(f, "no slot of {size} bytes can exist at offset {offset}")
            }
            Self::NotAllocated { offset } => {
                write!(f, "no slot allocated at offset {offset} (double free?)")
            }
            Self::StaleHandle {
                offset,
                generation,
                current,
            } => write!(
                f,
                "stale handle for offset {offset}: generation {generation}, live slot is {current}"
            ),
        }
    }
}

impl core::error::Error for BuddyError {}

/// An allocated slot, as the allocator issued it.
///
/// A handle can be stored as its parts and rebuilt ([`from_parts`]); the
/// allocator checks every handle it is given against its own records (pool,
/// offset, size, generation), so a stale, foreign, doubly freed or made-up
/// handle is refused with a typed error and never frees the wrong slot.
///
/// [`from_parts`]: Self::from_parts
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use = "a slot handle that is dropped leaks its slot"]
pub struct SlotHandle {
    offset: u64,
    size: u64,
    requested: u64,
    generation: u32,
    pool_id: u32,
}

impl SlotHandle {
    /// Rebuilds a handle from stored parts. `requested` only feeds the
    /// statistics; it is clamped to `size`.
    pub fn from_parts(
        offset: u64,
        size: u64,
        requested: u64,
        generation: u32,
        pool_id: u32,
    ) -> Self {
        Self {
            offset,
            size,
            requested: requested.min(size),
            generation,
            pool_id,
        }
    }

    /// Offset of the slot in the pool.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Size of the slot: the request rounded up to a power of two blocks.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size that was asked for (at most [`size`](Self::size)).
    pub fn requested(&self) -> u64 {
        self.requested
    }

    /// The allocation's generation at its offset.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The pool the slot belongs to.
    pub fn pool_id(&self) -> u32 {
        self.pool_id
    }
}

/// Failures by reason, for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Failures {
    /// Zero-byte requests.
    pub zero_size: u64,
    /// Requests larger than the pool can ever hold.
    pub too_large: u64,
    /// Requests that found no free block.
    pub out_of_space: u64,
    /// Frees of handles of another pool.
    pub foreign_handle: u64,
    /// Frees of impossible handles.
    pub invalid_handle: u64,
    /// Frees of slots not allocated (double frees).
    pub not_allocated: u64,
    /// Frees of stale handles.
    pub stale_handle: u64,
}

/// Counters of an allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuddyStats {
    /// Bytes in live slots (rounded sizes).
    pub allocated_bytes: u64,
    /// Bytes the live slots were asked for (before rounding).
    pub requested_bytes: u64,
    /// Live slots.
    pub live_slots: u64,
    /// Highest `allocated_bytes` seen.
    pub peak_allocated_bytes: u64,
    /// Successful allocations.
    pub allocations: u64,
    /// Successful frees.
    pub frees: u64,
    /// Failures by reason.
    pub failures: Failures,
}

/// How fragmented the free space is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragmentation {
    /// Free bytes.
    pub bytes_free: u64,
    /// The largest block that could be allocated now.
    pub largest_free: u64,
    /// Maximal free blocks (after all merges).
    pub free_blocks: u64,
    /// `1 - largest_free / bytes_free`, in parts per million: 0 when all
    /// free space is one block.
    pub external_ppm: u32,
    /// Bytes lost to rounding inside live slots, in parts per million of
    /// the allocated bytes.
    pub internal_ppm: u32,
}

/// A buddy allocator over caller-owned storage.
pub struct Buddy<'s> {
    tree: ManagedSlice<'s, u8>,
    generations: ManagedSlice<'s, u32>,
    config: BuddyConfig,
    /// log2(min_block).
    min_shift: u32,
    /// The order of the root (the tree covers `1 << top` leaves).
    top: u32,
    /// Maximal free blocks per order.
    free_blocks: [u64; 64],
    stats: BuddyStats,
}

impl fmt::Debug for Buddy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buddy")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// `(leaves, top order)` of a valid configuration.
fn geometry(config: &BuddyConfig) -> Result<(u64, u32), BuddyError> {
    let BuddyConfig {
        pool_size,
        min_block,
        ..
    } = *config;
    if !min_block.is_power_of_two() {
        return Err(BuddyError::MinBlockNotPowerOfTwo { min_block });
    }
    if pool_size == 0 || pool_size % min_block != 0 {
        return Err(BuddyError::PoolNotMultipleOfMinBlock {
            pool_size,
            min_block,
        });
    }
    let leaves = pool_size / min_block;
    let top = leaves.next_power_of_two().trailing_zeros();
    Ok((leaves, top))
}

impl<'s> Buddy<'s> {
    /// Storage a pool needs: `(tree bytes, generation words)`.
    pub fn storage_needed(config: &BuddyConfig) -> Result<(usize, usize), BuddyError> {
        let (leaves, top) = geometry(config)?;
        let too_big = BuddyError::StorageTooSmall {
            tree_needed: usize::MAX,
            generations_needed: usize::MAX,
        };
        let nodes = 1u64
            .checked_shl(top + 1)
            .map(|n| n - 1)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(too_big)?;
        let leaves = usize::try_from(leaves).map_err(|_| too_big)?;
        Ok((nodes, leaves))
    }

    /// An allocator with the whole pool free. `tree` and `generations` must
    /// hold at least [`storage_needed`](Self::storage_needed); initialising
    /// them is O(pool / min_block).
    pub fn new(
        config: BuddyConfig,
        tree: impl Into<ManagedSlice<'s, u8>>,
        generations: impl Into<ManagedSlice<'s, u32>>,
    ) -> Result<Self, BuddyError> {
        let (tree, generations) = (tree.into(), generations.into());
        let (leaves, top) = geometry(&config)?;
        let (nodes, gens) = Self::storage_needed(&config)?;
        if tree.len() < nodes || generations.len() < gens {
            return Err(BuddyError::StorageTooSmall {
                tree_needed: nodes,
                generations_needed: gens,
            });
        }
        let tree = tree.truncated(nodes);
        let mut generations = generations.truncated(gens);
        generations.fill(0);
        let mut b = Self {
            tree,
            generations,
            config,
            min_shift: config.min_block.trailing_zeros(),
            top,
            free_blocks: [0; 64],
            stats: BuddyStats::default(),
        };
        b.init(leaves);
        Ok(b)
    }

    /// Marks the first `leaves` leaves free and builds the tree bottom-up.
    fn init(&mut self, leaves: u64) {
        let first_leaf = (1usize << self.top) - 1;
        for (i, node) in self.tree[first_leaf..].iter_mut().enumerate() {
            *node = u8::from((i as u64) < leaves);
        }
        for i in (0..first_leaf).rev() {
            let order = self.order_of(i);
            self.tree[i] = self.combine(i, order);
        }
        // Count maximal free blocks: full nodes whose parent is not full.
        for i in 0..self.tree.len() {
            let order = self.order_of(i);
            let is_full = self.tree[i] == full(order);
            let parent_full = i > 0 && self.tree[(i - 1) / 2] == full(order + 1);
            if is_full && !parent_full {
                self.free_blocks[order as usize] += 1;
            }
        }
    }

    /// The order of node `i` (depth d has order `top - d`).
    #[inline]
    fn order_of(&self, i: usize) -> u32 {
        self.top - (usize::BITS - 1 - (i + 1).leading_zeros())
    }

    /// A node's value from its children's (at `order - 1`).
    #[inline]
    fn combine(&self, i: usize, order: u32) -> u8 {
        let l = self.tree[2 * i + 1] & LONGEST;
        let r = self.tree[2 * i + 2] & LONGEST;
        if l == full(order - 1) && r == full(order - 1) {
            full(order)
        } else {
            l.max(r)
        }
    }

    /// The order a request of `size` bytes needs.
    fn order_for(&self, size: u64) -> Result<u32, BuddyError> {
        let too_large = BuddyError::TooLarge {
            requested: size,
            max_slot: self.max_slot(),
        };
        if size == 0 {
            return Err(BuddyError::ZeroSize);
        }
        let blocks = size.div_ceil(self.config.min_block);
        let order = blocks
            .checked_next_power_of_two()
            .ok_or(too_large)?
            .trailing_zeros();
        if order > self.top || (self.config.min_block << order) > self.config.pool_size {
            return Err(too_large);
        }
        Ok(order)
    }

    /// Allocates a slot of at least `size` bytes: the lowest-addressed free
    /// block of the smallest power-of-two size that holds it.
    pub fn allocate(&mut self, size: u64) -> Result<SlotHandle, BuddyError> {
        let order = match self.order_for(size) {
            Ok(o) => o,
            Err(e) => {
                self.count_failure(&e);
                return Err(e);
            }
        };
        let want = full(order);
        if self.tree[0] & LONGEST < want {
            let e = BuddyError::OutOfSpace {
                requested: size,
                largest_free: self.largest_free(),
            };
            self.count_failure(&e);
            return Err(e);
        }
        let mut i = 0;
        let mut k = self.top;
        while k > order {
            if self.tree[i] == full(k) {
                // Split a free block: one block of order k becomes two.
                self.free_blocks[k as usize] -= 1;
                self.free_blocks[k as usize - 1] += 2;
            }
            let left = 2 * i + 1;
            i = if self.tree[left] & LONGEST >= want {
                left
            } else {
                left + 1
            };
            k -= 1;
        }
        self.free_blocks[order as usize] -= 1;
        self.tree[i] = ALLOCATED;
        self.update_ancestors(i, false);

        let block = self.config.min_block << order;
        let depth = self.top - order;
        let offset = ((i + 1 - (1usize << depth)) as u64) << (self.min_shift + order);
        let leaf = (offset >> self.min_shift) as usize;
        let generation = self.generations[leaf].wrapping_add(1);
        self.generations[leaf] = generation;

        let s = &mut self.stats;
        s.allocations += 1;
        s.live_slots += 1;
        s.allocated_bytes += block;
        s.requested_bytes += size;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
        Ok(SlotHandle {
            offset,
            size: block,
            requested: size,
            generation,
            pool_id: self.config.pool_id,
        })
    }

    /// Recomputes the ancestors of node `i`; when freeing, counts merges.
    fn update_ancestors(&mut self, mut i: usize, freeing: bool) {
        let mut order = self.order_of(i);
        while i > 0 {
            i = (i - 1) / 2;
            order += 1;
            let v = self.combine(i, order);
            if freeing && v == full(order) {
                self.free_blocks[order as usize - 1] -= 2;
                self.free_blocks[order as usize] += 1;
            }
            if self.tree[i] == v {
                // Nothing above can change either.
                break;
            }
            self.tree[i] = v;
        }
    }

    /// Frees the slot `handle` names; a handle that is stale, foreign, or
    /// already freed is refused and nothing changes.
    pub fn free(&mut self, handle: SlotHandle) -> Result<(), BuddyError> {
        let r = self.check(&handle);
        match r {
            Ok((node, order)) => {
                self.tree[node] = full(order);
                self.free_blocks[order as usize] += 1;
                self.update_ancestors(node, true);
                let s = &mut self.stats;
                s.frees += 1;
                s.live_slots -= 1;
                s.allocated_bytes -= handle.size;
                s.requested_bytes -= handle.requested;
                Ok(())
            }
            Err(e) => {
                self.count_failure(&e);
                Err(e)
            }
        }
    }

    /// The node and order of the live slot `handle` names.
    fn check(&self, h: &SlotHandle) -> Result<(usize, u32), BuddyError> {
        if h.pool_id != self.config.pool_id {
            return Err(BuddyError::ForeignHandle {
                handle_pool: h.pool_id,
                pool: self.config.pool_id,
            });
        }
        let invalid = BuddyError::InvalidHandle {
            offset: h.offset,
            size: h.size,
        };
        if !h.size.is_power_of_two() || h.size < self.config.min_block {
            return Err(invalid);
        }
        let order = (h.size >> self.min_shift).trailing_zeros();
        let end = h.offset.checked_add(h.size).ok_or(invalid)?;
        if order > self.top || h.offset % h.size != 0 || end > self.config.pool_size {
            return Err(invalid);
        }
        let depth = self.top - order;
        let node = (1usize << depth) - 1 + (h.offset >> (self.min_shift + order)) as usize;
        if self.tree[node] & ALLOCATED == 0 {
            return Err(BuddyError::NotAllocated { offset: h.offset });
        }
        let current = self.generations[(h.offset >> self.min_shift) as usize];
        if current != h.generation {
            return Err(BuddyError::StaleHandle {
                offset: h.offset,
                generation: h.generation,
                current,
            });
        }
        Ok((node, order))
    }

    fn count_failure(&mut self, e: &BuddyError) {
        let f = &mut self.stats.failures;
        match e {
            BuddyError::ZeroSize => f.zero_size += 1,
            BuddyError::TooLarge { .. } => f.too_large += 1,
            BuddyError::OutOfSpace { .. } => f.out_of_space += 1,
            BuddyError::ForeignHandle { .. } => f.foreign_handle += 1,
            BuddyError::InvalidHandle { .. } => f.invalid_handle += 1,
            BuddyError::NotAllocated { .. } => f.not_allocated += 1,
            BuddyError::StaleHandle { .. } => f.stale_handle += 1,
            _ => {}
        }
    }

    /// The pool's shape.
    pub fn config(&self) -> &BuddyConfig {
        &self.config
    }

    /// The largest slot the pool can ever hand out.
    pub fn max_slot(&self) -> u64 {
        let mut order = self.top;
        while order > 0 && (self.config.min_block << order) > self.config.pool_size {
            order -= 1;
        }
        self.config.min_block << order
    }

    /// Counters for operators.
    pub fn stats(&self) -> &BuddyStats {
        &self.stats
    }

    /// Free bytes.
    pub fn bytes_free(&self) -> u64 {
        self.free_blocks_by_order()
            .iter()
            .enumerate()
            .map(|(k, &n)| n << (self.min_shift as usize + k))
            .sum()
    }

    /// The largest block that could be allocated now (0 if none).
    pub fn largest_free(&self) -> u64 {
        match self.tree[0] & LONGEST {
            0 => 0,
            v => self.config.min_block << (v - 1),
        }
    }

    /// How many slots of `size` bytes could be allocated now, one after
    /// another.
    pub fn free_slots_of(&self, size: u64) -> u64 {
        let Ok(order) = self.order_for(size) else {
            return 0;
        };
        self.free_blocks_by_order()[order as usize..]
            .iter()
            .enumerate()
            .map(|(d, &n)| n << d)
            .sum()
    }

    /// Maximal free blocks of each order (index: order; size
    /// `min_block << order`).
    pub fn free_blocks_by_order(&self) -> &[u64] {
        &self.free_blocks[..=self.top as usize]
    }

    /// Fragmentation figures.
    pub fn fragmentation(&self) -> Fragmentation {
        let bytes_free = self.bytes_free();
        let largest_free = self.largest_free();
        let ppm = |part: u64, whole: u64| -> u32 {
            if whole == 0 {
                0
            } else {
                (u128::from(part) * 1_000_000 / u128::from(whole)) as u32
            }
        };
        let s = &self.stats;
        Fragmentation {
            bytes_free,
            largest_free,
            free_blocks: self.free_blocks.iter().sum(),
            external_ppm: ppm(bytes_free - largest_free, bytes_free),
            internal_ppm: ppm(s.allocated_bytes - s.requested_bytes, s.allocated_bytes),
        }
    }
}

/// The node value of a fully free block of `order`.
#[inline]
const fn full(order: u32) -> u8 {
    order as u8 + 1
}
