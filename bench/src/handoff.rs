//! Hand-offs through the full handshake over any data plane, and
//! single-thread `memcpy` of the same sizes in the same run: `ferry bench
//! [--backend NAME]`.
//!
//! A coordinator, a sender and a receiver run as nodes of this process
//! ([`crate::rig`]), on the data plane given and over the control channel
//! it pairs with (Unix sockets, or ZeroMQ on loopback for the planes that
//! need it), exactly as separate processes would use them. Each hand-off
//! is timed from `commit` to the receiver holding the data (the control
//! round trips plus the write); right after it, the same bytes are copied
//! once by `memcpy` between two private buffers, and, where the nodes talk
//! over Unix sockets, each message of the hand-off's path is sent alone
//! over a bare socket pair ([`crate::hops`]), so that all three figures
//! see the same machine.

use std::time::{Duration, Instant};

use tensorferry::runtime::telemetry::Telemetry;
use tensorferry::runtime::{DataPlane, NodeError};
use tensorferry_core::transport::FaultKind;

use crate::hops::{fast_path, UnixHops};
use crate::rig::{Control, Guards, Pools, Rig};

/// Sizes measured by default: 4 KiB to 256 MiB.
pub const SIZES: [u64; 7] = [
    4 << 10,
    64 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
    256 << 20,
];

/// Hand-offs between two blocks of bare hops, and the rounds of each block.
const HOP_BLOCK: usize = 64;

/// The pause before a block of bare hops: longer than a node's threads
/// poll after their last message, so that none runs beside the hops.
const QUIET: Duration = Duration::from_millis(1);

/// One size's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Bytes per hand-off.
    pub size: u64,
    /// Hand-offs timed.
    pub iterations: usize,
    /// Median hand-off latency, µs.
    pub p50_us: f64,
    /// 99th-percentile hand-off latency, µs.
    pub p99_us: f64,
    /// Hand-off throughput at the median, GB/s.
    pub gbps: f64,
    /// Single-thread memcpy at its median, GB/s.
    pub memcpy_gbps: f64,
    /// The hand-off's floor over Unix sockets: the median one-way time of
    /// each message on its path sent alone over a bare socket pair, summed
    /// (µs); `None` where the nodes talk over ZeroMQ.
    pub hop_sum_us: Option<f64>,
    /// Messages on the path the hop sum counts.
    pub path_messages: usize,
}

impl Row {
    /// Hand-off throughput over memcpy throughput.
    pub fn ratio(&self) -> f64 {
        self.gbps / self.memcpy_gbps
    }

    /// The hand-off's median over the sum of its hops (1: at the floor).
    pub fn over_hops(&self) -> Option<f64> {
        self.hop_sum_us.map(|h| self.p50_us / h)
    }
}

/// A failure of the bare hops' socket pair, as the benchmark's error.
/// One block of bare hops: each message of `path` alone over `hops`, once
/// the nodes' threads went back to sleep, its half round trips added to
/// `hop_ns`.
fn hop_block(
    hops: &mut UnixHops,
    path: &[(&'static str, Vec<u8>)],
    hop_ns: &mut [Vec<f64>],
) -> Result<(), NodeError> {
    std::thread::sleep(QUIET);
    // A ping-pong, as such floors are measured: its first round (both
    // threads woken from a long sleep) untimed.
    for round in 0..=HOP_BLOCK {
        for ((_, packet), times) in path.iter().zip(hop_ns.iter_mut()) {
            let rtt = hops
                .round_trip(packet)
                .map_err(|e| hop_error("time a bare hop", e))?;
            if round > 0 {
                times.push(rtt.as_nanos() as f64 / 2.0);
            }
        }
    }
    Ok(())
}

fn hop_error(verb: &'static str, e: std::io::Error) -> NodeError {
    NodeError::transport(verb, FaultKind::Io, e)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Times hand-offs of each size over `plane` for about `per_size` (at
/// least 5, at most 10,000 each), the nodes talking over the control
/// channel the plane pairs with ([`Control::of`]); `progress(size, done)`
/// is told as it goes. The nodes are added to `telemetry` while they run.
pub fn measure(
    plane: &DataPlane,
    sizes: &[u64],
    per_size: Duration,
    telemetry: &Telemetry,
    mut progress: impl FnMut(u64, usize),
) -> Result<Vec<Row>, NodeError> {
    let largest = sizes.iter().copied().max().unwrap_or(4096);
    let slot = largest.next_power_of_two().max(1 << 20);
    let pools = Pools::fast_path(slot);
    let control = Control::of(plane);
    let mut hops = match control {
        Control::Unix => Some(
            UnixHops::start()
                .map_err(|e| hop_error("start the bare socket pair the hops are timed over", e))?,
        ),
        Control::Zmq => None,
    };
    let rig = Rig::start(plane, control, &Guards::default(), pools, Some(telemetry))?;
    let mut src = vec![0x5au8; largest as usize];
    let mut dst = vec![0u8; largest as usize];
    // Touch both private buffers once so memcpy pays no page faults.
    dst.copy_from_slice(&src);
    src[0] = 1;
    let mut rows = Vec::new();
    for (n, &size) in sizes.iter().enumerate() {
        let shape = [size];
        let spec = [crate::blob(&shape)];
        let (mut handoff, mut copy_ns) = (Vec::new(), Vec::new());
        let path = fast_path(size)
            .map_err(|e| hop_error("encode the hand-off's messages", std::io::Error::other(e)))?;
        let mut hop_ns: Vec<Vec<f64>> = vec![Vec::new(); path.len()];
        let start = Instant::now();
        let mut i = 0usize;
        // Two untimed rounds first: connections, mappings, caches.
        while i < 10_000 && (i < 7 || start.elapsed() < per_size) {
            let id = format!("b{n}-{i}");
            let mut staging = rig.sender.stage(&id, &spec)?;
            if let Some(t) = staging.tensor_mut(0) {
                t[0] = i as u8;
            }
            let t0 = Instant::now();
            staging.commit("{}")?;
            let Some(d) = rig.receiver.recv(Duration::from_secs(30)) else {
                return Err(NodeError::Timeout {
                    what: "a benchmark hand-off",
                    after: Duration::from_secs(30),
                });
            };
            let took = t0.elapsed();
            d.release();
            let _ = rig.sender.next_outcome(Duration::from_secs(30));
            let len = size as usize;
            let c0 = Instant::now();
            dst[..len].copy_from_slice(&src[..len]);
            let copied = c0.elapsed();
            std::hint::black_box(&dst);
            if i >= 2 {
                handoff.push(took.as_nanos() as f64);
                copy_ns.push(copied.as_nanos() as f64);
            }
            // Every HOP_BLOCK hand-offs, as many rounds of the bare hops,
            // once the nodes' threads went back to sleep: each hop alone.
            if let Some(hops) = hops.as_mut().filter(|_| i % HOP_BLOCK == HOP_BLOCK - 1) {
                hop_block(hops, &path, &mut hop_ns)?;
            }
            i += 1;
            progress(size, i);
        }
        // A size with fewer hand-offs than a block still gets its floor.
        if let Some(hops) = hops.as_mut().filter(|_| hop_ns.iter().any(Vec::is_empty)) {
            hop_block(hops, &path, &mut hop_ns)?;
        }
        handoff.sort_by(f64::total_cmp);
        copy_ns.sort_by(f64::total_cmp);
        let hop_sum_us = hops.is_some().then(|| {
            hop_ns
                .iter_mut()
                .map(|t| {
                    t.sort_by(f64::total_cmp);
                    percentile(t, 0.5) / 1e3
                })
                .sum()
        });
        let (p50, p99) = (percentile(&handoff, 0.5), percentile(&handoff, 0.99));
        rows.push(Row {
            size,
            iterations: handoff.len(),
            p50_us: p50 / 1e3,
            p99_us: p99 / 1e3,
            gbps: size as f64 / p50,
            memcpy_gbps: size as f64 / percentile(&copy_ns, 0.5),
            hop_sum_us,
            path_messages: path.len(),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plane_of_one_host_hands_off_by_its_name_over_unix_sockets() {
        for name in ["shm", "local"] {
            let none: [(&str, &str); 0] = [];
            let plane = DataPlane::parse(name, none).unwrap();
            assert_eq!(Control::of(&plane), Control::Unix, "{name}");
            let rows = measure(
                &plane,
                &[4096, 1 << 20],
                Duration::from_millis(20),
                &Telemetry::new(),
                |_, _| {},
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(rows.len(), 2, "{name}");
            for (row, size) in rows.iter().zip([4096, 1 << 20]) {
                assert_eq!(row.size, size, "{name}");
                assert!(row.iterations >= 5, "{name}: {row:?}");
                assert!(
                    row.p50_us > 0.0 && row.p99_us >= row.p50_us,
                    "{name}: {row:?}"
                );
                assert_eq!(row.path_messages, 4, "{name}");
                assert!(row.hop_sum_us.is_some_and(|h| h > 0.0), "{name}: {row:?}");
            }
        }
    }
}
