//! Latency histograms: observed on the hand-off path without allocating,
//! read as snapshots.

use super::*;

/// Upper bounds of the latency histograms' buckets, in seconds: 10 µs
/// doubling up to about 10.5 s, which spans a 4 KiB shared-memory hand-off
/// and a head's timeout of a stalled one.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    (0..21).map(|k| 1e-5 * f64::from(1u32 << k))
}

/// One latency distribution: a Prometheus histogram, with its count, sum,
/// least and greatest kept exactly for readers that are not Prometheus.
#[derive(Debug)]
pub struct Latency {
    pub(super) histogram: Histogram,
    pub(super) count: AtomicU64,
    pub(super) sum_nanos: AtomicU64,
    pub(super) min_nanos: AtomicU64,
    pub(super) max_nanos: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            histogram: Histogram::new(latency_buckets()),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
            min_nanos: AtomicU64::new(u64::MAX),
            max_nanos: AtomicU64::new(0),
        }
    }
}

/// A [`Latency`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Observations.
    pub count: u64,
    /// Their sum.
    pub sum: Duration,
    /// The least (`None` before the first).
    pub min: Option<Duration>,
    /// The greatest (`None` before the first).
    pub max: Option<Duration>,
}

impl Latency {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.observe(d.as_secs_f64());
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.min_nanos.fetch_min(nanos, Ordering::Relaxed);
        self.max_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> LatencySnapshot {
        let count = self.count.load(Ordering::Relaxed);
        let some = |n: u64| (count > 0).then(|| Duration::from_nanos(n));
        LatencySnapshot {
            count,
            sum: Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)),
            min: some(self.min_nanos.load(Ordering::Relaxed)),
            max: some(self.max_nanos.load(Ordering::Relaxed)),
        }
    }
}
