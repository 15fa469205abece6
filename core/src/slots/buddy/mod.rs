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
mod types;
pub use types::{BuddyConfig, BuddyError, BuddyStats, Failures, Fragmentation, SlotHandle};

const ALLOCATED: u8 = 0x80;
/// The bits of a node that hold "largest free order + 1".
const LONGEST: u8 = 0x7f;

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
                // `requested` is the handle's word alone (a rebuilt handle
                // may say another length than the allocation was asked
                // for): the figure may drift, but never past its bounds.
                s.requested_bytes = s
                    .requested_bytes
                    .saturating_sub(handle.requested)
                    .min(s.allocated_bytes);
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
