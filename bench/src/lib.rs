//! ferry's benchmarks, in one place: what `ferry bench` measures (each
//! module one benchmark, each comparing side by side in one run and
//! printing ratios), the criterion benchmarks of the pieces (`benches/`),
//! and the Python the figures are compared against (`python/`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

use tensorferry_core::slots::{Dtype, TensorSpec};

pub mod control;
pub mod curve;
#[cfg(feature = "fabric")]
pub mod fabric;
pub mod handoff;
pub mod handshake;
pub mod hops;
pub mod rig;
pub mod scale;
pub mod slots;
pub mod wire;

/// A workload of one flat tensor: `dims[0]` bytes of `uint8`, named
/// `blob` (the hand-off benchmarks, and the pipeline's random workload).
pub fn blob(dims: &[u64; 1]) -> TensorSpec<'_> {
    TensorSpec {
        field: "blob",
        list_index: None,
        shape: dims,
        dtype: Dtype::UInt8,
        byte_len: dims[0],
    }
}
