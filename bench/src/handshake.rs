//! Control-plane hand-offs per second: a coordinator, an encoder and a
//! denoiser in one process, every message encoded and decoded, writes
//! completed at once (no data moves): `ferry bench handshake`, the first
//! row of `ferry bench scale` ([`crate::scale`]).

use std::time::Duration;

use crate::scale::{measure as measure_row, Deployment};

/// One encoder, one denoiser that releases each delivery at once.
const ONE_TO_ONE: Deployment = Deployment {
    encoders: 1,
    denoisers: 1,
    held: 0,
};

/// Runs hand-offs for about `duration`: the preallocated-slot fast path,
/// or the slow path through `transfer_alloc`. Returns hand-offs per second.
pub fn measure(duration: Duration, fast_path: bool) -> Result<f64, String> {
    measure_row(ONE_TO_ONE, fast_path, duration).map(|r| r.per_second)
}
