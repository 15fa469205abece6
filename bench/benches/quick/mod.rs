//! What the criterion benches share: how long they warm up and measure,
//! and the `main` that runs them.

use std::time::Duration;

use criterion::Criterion;

/// Runs `bench` the way `criterion_main!` would, with a short warm-up
/// and measurement: these benches break ferry's time down, and the
/// side-by-side comparisons with the seed's Python are elsewhere
/// (`bench/python/vs_python.sh`).
pub fn run(bench: fn(&mut Criterion)) {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    bench(&mut c);
    c.final_summary();
}
