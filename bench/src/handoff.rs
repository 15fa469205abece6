//! Hand-offs through the full handshake on the shared-memory loopback, and
//! single-thread `memcpy` of the same sizes in the same run: `ferry bench`.
//!
//! A coordinator, a sender and a receiver run as nodes of this process,
//! over Unix sockets and shared-memory pools, exactly as separate processes
//! would use them. Each hand-off is timed from `commit` to the receiver
//! holding the data (the control round trips plus the write); right after
//! it, the same bytes are copied once by `memcpy` between two private
//! buffers, so that both figures see the same machine.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tensorferry_shm::UdsChannel;

use tensorferry::runtime::telemetry::Telemetry;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, CopyConfig, DataPlane, InstanceNode,
    InstanceNodeConfig, NodeError, Prealloc,
};

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
}

impl Row {
    /// Hand-off throughput over memcpy throughput.
    pub fn ratio(&self) -> f64 {
        self.gbps / self.memcpy_gbps
    }
}

/// A fresh `ipc://` endpoint for a benchmark's node.
pub(crate) fn endpoint(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!(
        "ipc://{}/ferry-bench-{}-{n}-{tag}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// Field order is drop order: the instances stop before their
/// coordinator, which a healthy run's instances must not see go.
struct Rig {
    sender: InstanceNode,
    receiver: InstanceNode,
    _coordinator: CoordinatorNode,
}

/// A Unix-socket control channel at a fresh endpoint.
pub(crate) fn bind(tag: &str) -> Result<UdsChannel, NodeError> {
    UdsChannel::bind(&endpoint(tag)).map_err(|e| NodeError::transport("bind control endpoint", e))
}

fn rig(largest: u64, copy: CopyConfig, telemetry: &Telemetry) -> Result<Rig, NodeError> {
    let coordinator = CoordinatorNode::start(
        &CoordinatorNodeConfig::new(&["sender", "receiver"]),
        bind("coord")?,
        |_| {},
    )?;
    let slot = largest.next_power_of_two().max(1 << 20);
    let pool = usize::try_from(2 * slot).unwrap_or(usize::MAX);
    let s = InstanceNodeConfig::new("sender", coordinator.endpoint());
    let plane = DataPlane::Shm(copy);
    let sender = plane.start_instance_at(&s, pool, &endpoint("sender"))?;
    let mut r = InstanceNodeConfig::new("receiver", coordinator.endpoint());
    // Receive slots set aside: every hand-off takes the fast path.
    r.config.prealloc = Prealloc {
        count: 2,
        size: slot,
    };
    let receiver = plane.start_instance_at(&r, pool, &endpoint("receiver"))?;
    sender.wait_registered(Duration::from_secs(10))?;
    receiver.wait_registered(Duration::from_secs(10))?;
    telemetry.add_coordinator(coordinator.probe(), "coordinator");
    telemetry.add_instance(sender.probe(), "sender");
    telemetry.add_instance(receiver.probe(), "receiver");
    Ok(Rig {
        _coordinator: coordinator,
        sender,
        receiver,
    })
}

/// Times hand-offs of each size for about `per_size` (at least 5, at most
/// 10,000 each); `progress(size, done, of)` is told as it goes. The
/// nodes are added to `telemetry` while they run.
pub fn measure(
    sizes: &[u64],
    per_size: Duration,
    copy: CopyConfig,
    telemetry: &Telemetry,
    mut progress: impl FnMut(u64, usize),
) -> Result<Vec<Row>, NodeError> {
    let largest = sizes.iter().copied().max().unwrap_or(4096);
    let rig = rig(largest, copy, telemetry)?;
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
            i += 1;
            progress(size, i);
        }
        handoff.sort_by(f64::total_cmp);
        copy_ns.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&handoff, 0.5), percentile(&handoff, 0.99));
        rows.push(Row {
            size,
            iterations: handoff.len(),
            p50_us: p50 / 1e3,
            p99_us: p99 / 1e3,
            gbps: size as f64 / p50,
            memcpy_gbps: size as f64 / percentile(&copy_ns, 0.5),
        });
    }
    Ok(rows)
}
