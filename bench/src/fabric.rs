//! `ferry bench --backend fabric --against raw`: hand-offs through the
//! full handshake over a libfabric provider, against the raw baseline, the
//! same writes posted through the libfabric layer alone
//! ([`tensorferry_fabric::baseline`]), in the same run. (Without
//! `--against raw`, `ferry bench --backend fabric` times hand-offs one at
//! a time against memcpy, as over any data plane: [`crate::handoff`].)
//!
//! Both keep `window` transfers in flight, as `fi_rma_bw` does, and count
//! a transfer when it is delivered: for ferry, when the receiver holds it
//! (its `transfer_ready` accepted after the write landed); for the
//! baseline, at its delivery-complete completion or its notice at the
//! receiver. A coordinator, a sender and a receiver run as nodes of this
//! process ([`crate::rig`]), over ZeroMQ on loopback for control, as
//! libfabric's nodes talk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tensorferry_fabric::baseline::RawPair;
use tensorferry_fabric::FabricConfig;

use crate::rig::{Control, Guards, Pools, Rig};
use tensorferry::runtime::telemetry::Telemetry;
use tensorferry::runtime::{DataPlane, NodeError, Prealloc};

/// Sizes measured by default.
pub const SIZES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

/// Most pool bytes one side maps for a size (limits the window of large
/// sizes).
const POOL_BUDGET: u64 = 1 << 30;

/// One size's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Bytes per transfer.
    pub size: u64,
    /// Transfers in flight.
    pub window: usize,
    /// Hand-offs through ferry (all rounds).
    pub transfers: u64,
    /// ferry, GB/s (median round).
    pub gbps: f64,
    /// Writes of the baseline (all rounds).
    pub raw_writes: u64,
    /// The baseline, GB/s (median round).
    pub raw_gbps: f64,
}

impl Row {
    /// ferry over the baseline.
    pub fn ratio(&self) -> f64 {
        self.gbps / self.raw_gbps
    }
}

/// What the run used.
#[derive(Clone, Debug)]
pub struct Report {
    /// The provider.
    pub provider: String,
    /// The delivery mode.
    pub delivery: &'static str,
    /// One row per size.
    pub rows: Vec<Row>,
}

/// ferry's nodes over libfabric with `config`: `window` slots of `slot`
/// bytes at the sender, and as many set aside at the receiver.
fn rig(
    config: &FabricConfig,
    slot: u64,
    window: usize,
    telemetry: &Telemetry,
) -> Result<Rig, NodeError> {
    let plane = DataPlane::Fabric(config.clone());
    let pool = usize::try_from(slot * window as u64).unwrap_or(usize::MAX);
    let pools = Pools {
        sender: pool,
        // A receive slot set aside for each transfer in flight (the fast
        // path), and as much room again for a slot the coordinator has
        // not yet seen released.
        receiver: 2 * pool,
        prealloc: Prealloc {
            count: window,
            size: slot,
        },
    };
    Rig::start(
        &plane,
        Control::of(&plane),
        &Guards::default(),
        pools,
        Some(telemetry),
    )
}

/// A count another thread can wait on.
#[derive(Default)]
struct Counter {
    n: Mutex<u64>,
    changed: Condvar,
}

impl Counter {
    fn bump(&self) {
        *self.n.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.changed.notify_all();
    }

    fn get(&self) -> u64 {
        *self.n.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the count exceeds `n`, at most `wait`.
    fn wait_above(&self, n: u64, wait: Duration) {
        let g = self.n.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .changed
            .wait_timeout_while(g, wait, |c| *c <= n)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// Hand-offs of `size` bytes, `window` in flight, for about `time`.
fn ferry_run(
    rig: &Rig,
    size: u64,
    window: usize,
    time: Duration,
    tag: usize,
) -> Result<(u64, f64), NodeError> {
    let stop = AtomicBool::new(false);
    let received = Counter::default();
    std::thread::scope(|scope| {
        let rx = std::thread::Builder::new()
            .name("bench-receiver".into())
            .spawn_scoped(scope, || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(d) = rig.receiver.recv(Duration::from_millis(20)) {
                        d.release();
                        received.bump();
                    }
                }
            })
            .map_err(NodeError::Thread)?;
        let seconds = send(rig, size, window, time, tag, &received);
        stop.store(true, Ordering::Relaxed);
        let _ = rx.join();
        let got = received.get();
        Ok((got, got as f64 * size as f64 / seconds? / 1e9))
    })
}

/// Commits hand-offs of `size` bytes, at most `window` not yet `received`,
/// for about `time`, then waits for the last to be received: how long
/// that took, in seconds.
fn send(
    rig: &Rig,
    size: u64,
    window: usize,
    time: Duration,
    tag: usize,
    received: &Counter,
) -> Result<f64, NodeError> {
    let shape = [size];
    let spec = [crate::blob(&shape)];
    let start = Instant::now();
    let mut committed = 0u64;
    let mut failed = 0u64;
    while start.elapsed() < time {
        // In flight until the receiver holds it, as for the baseline.
        while let Some(o) = rig.sender.next_outcome(Duration::ZERO) {
            failed += u64::from(!o.sent);
        }
        if committed - failed >= window as u64 {
            received.wait_above(committed - failed - window as u64, Duration::from_millis(5));
            if committed.saturating_sub(received.get() + failed) >= window as u64 {
                continue;
            }
        }
        let staging = rig.sender.stage(&format!("f{tag}-{committed}"), &spec)?;
        staging.commit("{}")?;
        committed += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.get() + failed < committed && Instant::now() < deadline {
        if let Some(o) = rig.sender.next_outcome(Duration::from_millis(10)) {
            failed += u64::from(!o.sent);
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Alternating rounds per size.
const ROUNDS: usize = 5;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Measures each size in alternating rounds of ferry and the baseline;
/// `progress(size)` is told as each starts. Each size's nodes are added
/// to `telemetry` while they run.
pub fn measure(
    config: &FabricConfig,
    sizes: &[u64],
    window: usize,
    per_size: Duration,
    telemetry: &Telemetry,
    mut progress: impl FnMut(u64),
) -> Result<Report, String> {
    let mut rows = Vec::new();
    let mut provider = String::new();
    let mut delivery = "";
    for (tag, &size) in sizes.iter().enumerate() {
        progress(size);
        let slot = size.next_power_of_two().max(1 << 20);
        // The coordinator takes only so many preallocated slots.
        let most = tensorferry::runtime::Limits::COORDINATOR.prealloc_per_member as u64;
        let window = window.clamp(1, (POOL_BUDGET / 2 / slot).clamp(1, most) as usize);
        let rig = rig(config, slot, window, telemetry)
            .map_err(|e| format!("ferry over libfabric: {e}"))?;
        // The baseline cycles through as many slot-sized places as ferry's
        // sender has slots.
        let pool = usize::try_from(slot * window as u64).unwrap_or(usize::MAX);
        let mut raw = RawPair::open(config, pool).map_err(|e| format!("raw baseline: {e}"))?;
        provider = raw.provider().to_owned();
        delivery = raw.delivery().as_str();
        // Short rounds, alternating, so that both see the same machine;
        // the median round of each is reported.
        let round = per_size / ROUNDS as u32;
        let (mut ferry_gbps, mut raw_gbps) = (Vec::new(), Vec::new());
        let (mut transfers, mut raw_writes) = (0, 0);
        for k in 0..ROUNDS {
            let (n, g) = ferry_run(&rig, size, window, round, tag * ROUNDS + k)
                .map_err(|e| format!("ferry hand-offs: {e}"))?;
            transfers += n;
            ferry_gbps.push(g);
            let r = raw
                .run(size as usize, slot as usize, window, round)
                .map_err(|e| format!("raw baseline: {e}"))?;
            raw_writes += r.writes;
            raw_gbps.push(r.bytes_per_second / 1e9);
        }
        rows.push(Row {
            size,
            window,
            transfers,
            gbps: median(&mut ferry_gbps),
            raw_writes,
            raw_gbps: median(&mut raw_gbps),
        });
    }
    Ok(Report {
        provider,
        delivery,
        rows,
    })
}
