//! Slot accounting: how an instance carves its registered pool into slots,
//! and how the coordinator counts what each instance can still take.
//!
//! * [`Buddy`]: a power-of-two buddy allocator over pool offsets, with
//!   handles that cannot be freed twice or forged;
//! * [`layout`]: 512-byte-aligned tensor layout of a request and the
//!   manifest that describes it, plus the receiver's check of a manifest
//!   against its slot;
//! * [`PreallocTable`]: a receiver's preallocated receive slots, recycled at
//!   their original size;
//! * [`Capacity`]: the per-instance counter the coordinator dispatches by;
//! * [`PoolRange`]: where a slot lies in its pool.
//!
//! All storage is fixed by const generics or handed in by the caller.

mod buddy;
mod capacity;
mod dtype;
mod layout;
mod prealloc;
mod range;

pub use buddy::{Buddy, BuddyConfig, BuddyError, BuddyStats, Failures, Fragmentation, SlotHandle};
pub use capacity::{Capacity, CapacityError, CapacityTicket};
pub use dtype::{Dtype, UnknownDtype};
pub use layout::{
    check_manifest, entry_bytes, layout, Layout, LayoutError, ManifestExtent, TensorSpec,
    TENSOR_ALIGN,
};
pub use prealloc::{PreallocError, PreallocTable};
pub use range::PoolRange;
