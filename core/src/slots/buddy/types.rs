//! What the allocator's callers hold and read: its configuration, its
//! errors, a slot's handle, and the figures it keeps.

use super::*;

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
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) generation: u32,
    pub(super) pool_id: u32,
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
