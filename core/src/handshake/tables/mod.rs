//! The machines' tables and what finds things in them in constant time:
//! a keyed hash ([`HashKey`]), an index by it, heaps of deadlines, and the
//! table that ties them to its records ([`TableStorage`]).

pub(crate) mod hash;
pub(crate) mod heap;
pub(crate) mod index;
pub(crate) mod table;

#[cfg(all(test, feature = "alloc"))]
mod flood;

pub use hash::HashKey;
pub use heap::HeapEntry;
pub use index::MAX_PROBE;
pub use table::{TableSizes, TableStorage};

/// The key of tables a machine owns: random with the `std` feature, the
/// fixed key without a source of randomness.
#[cfg(feature = "alloc")]
pub(crate) fn default_key() -> HashKey {
    #[cfg(feature = "std")]
    {
        HashKey::random()
    }
    #[cfg(not(feature = "std"))]
    {
        HashKey::FIXED
    }
}
