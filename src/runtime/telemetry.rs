//! What nodes measure, in two forms: plain snapshots a runtime reads
//! ([`Latency::snapshot`], [`InstanceProbe`], [`CoordinatorProbe`]), and
//! Prometheus' exposition formats through [`Telemetry`], a
//! [`prometheus_client`] collector over any number of nodes.
//!
//! The hand-off path only adds to atomics and observes into
//! preallocated histograms (a short lock, no allocation); everything else,
//! labels and text included, is built when a scrape asks for it.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use ferry_core::handshake::coordinator::{FailReason, LegTiming};
use ferry_core::handshake::instance::{InstanceStats, SendTiming};
use ferry_core::transport::FaultKind;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::coordinator::CoordinatorSnapshot;
use super::metrics::{Metrics, MetricsSnapshot};

/// The kept library the exposition goes through, re-exported so that an
/// embedding runtime registers [`Telemetry`] in a [`Registry`] of the same
/// version.
pub use prometheus_client;

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
    histogram: Histogram,
    count: AtomicU64,
    sum_nanos: AtomicU64,
    min_nanos: AtomicU64,
    max_nanos: AtomicU64,
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

/// Where `kind` counts among the write failures: its place in the core's
/// table of kinds ([`FaultKind::ALL`], whose names label the counter).
fn fault_index(kind: FaultKind) -> usize {
    FaultKind::ALL
        .iter()
        .position(|k| *k == kind)
        // The table is the core's and complete; were it not, i/o (last).
        .unwrap_or(FaultKind::ALL.len() - 1)
}

/// The gauges of an instance, copied in on each turn of its state machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceGauges {
    /// Requests held (any state, quarantined slots included).
    pub requests_held: u64,
    /// Preallocated slots in use.
    pub prealloc_in_use: u64,
    /// Preallocated receive slots.
    pub prealloc_slots: u64,
    /// Pool slots allocated (preallocated slots included).
    pub live_slots: u64,
}

/// What an instance node measures, shared between the node and whoever
/// reads it ([`InstanceNode::probe`](super::InstanceNode::probe)).
#[derive(Debug)]
pub struct InstanceProbe {
    role: String,
    /// The runtime's counters.
    pub metrics: Metrics,
    /// Committed to `transfer_push` received: the wait for a receiver.
    pub send_queue: Latency,
    /// `transfer_push` received to the write's completion.
    pub write: Latency,
    /// A delivery's arrival to its release by the application.
    pub hold: Latency,
    write_faults: [AtomicU64; FaultKind::ALL.len()],
    state: Mutex<(InstanceGauges, InstanceStats)>,
}

impl InstanceProbe {
    pub(crate) fn new(role: &str) -> Self {
        Self {
            role: role.to_owned(),
            metrics: Metrics::default(),
            send_queue: Latency::default(),
            write: Latency::default(),
            hold: Latency::default(),
            write_faults: Default::default(),
            state: Mutex::new(Default::default()),
        }
    }

    /// The role the node registered as.
    pub fn role(&self) -> &str {
        &self.role
    }

    pub(crate) fn sent(&self, timing: &SendTiming) {
        self.send_queue.observe(timing.queued);
        self.write.observe(timing.written);
    }

    pub(crate) fn write_failed(&self, kind: FaultKind) {
        Metrics::add(&self.metrics.write_errors, 1);
        self.write_faults[fault_index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed writes of `kind` so far.
    pub fn write_failures(&self, kind: FaultKind) -> u64 {
        self.write_faults[fault_index(kind)].load(Ordering::Relaxed)
    }

    pub(crate) fn set_state(&self, gauges: InstanceGauges, stats: InstanceStats) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = (gauges, stats);
    }

    /// The gauges and the state machine's counters as of its last turn.
    pub fn state(&self) -> (InstanceGauges, InstanceStats) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The latencies of one leg (hand-offs from one role) at the coordinator.
#[derive(Debug, Default)]
pub struct LegLatencies {
    /// Staged to ready: the hand-off.
    pub handoff: Latency,
    /// Staged to `transfer_push` sent.
    pub queue: Latency,
    /// `transfer_push` sent to `transfer_pushed`.
    pub write: Latency,
    /// `transfer_ready` sent to `transfer_done`.
    pub consume: Latency,
    delivered: AtomicU64,
    failed: [AtomicU64; FailReason::ALL.len()],
}

impl LegLatencies {
    /// Legs delivered.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Legs failed for `reason`.
    pub fn failures(&self, reason: FailReason) -> u64 {
        self.failed[reason.index()].load(Ordering::Relaxed)
    }
}

/// What a coordinator node measures, shared between the node and whoever
/// reads it ([`CoordinatorNode::probe`](super::CoordinatorNode::probe)).
#[derive(Debug)]
pub struct CoordinatorProbe {
    pipeline: Vec<String>,
    /// The runtime's counters.
    pub metrics: Metrics,
    /// Per leg, in pipeline order of the sending role.
    pub legs: Vec<LegLatencies>,
    snapshot: Mutex<CoordinatorSnapshot>,
}

impl CoordinatorProbe {
    pub(crate) fn new(pipeline: &[String]) -> Self {
        Self {
            pipeline: pipeline.to_vec(),
            metrics: Metrics::default(),
            legs: pipeline.iter().map(|_| LegLatencies::default()).collect(),
            snapshot: Mutex::new(CoordinatorSnapshot::default()),
        }
    }

    /// The roles, in hand-off order (leg `n` is sent by role `n`).
    pub fn pipeline(&self) -> &[String] {
        &self.pipeline
    }

    pub(crate) fn delivered(&self, leg: usize, timing: &LegTiming) {
        if let Some(l) = self.legs.get(leg) {
            l.delivered.fetch_add(1, Ordering::Relaxed);
            l.handoff.observe(timing.to_ready());
            l.queue.observe(timing.queued);
            l.write.observe(timing.written);
            l.consume.observe(timing.consumed);
        }
    }

    pub(crate) fn failed(&self, leg: usize, reason: FailReason) {
        if let Some(l) = self.legs.get(leg) {
            l.failed[reason.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_snapshot(&self, s: CoordinatorSnapshot) {
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = s;
    }

    /// Figures as of the progress thread's last turn (the runtime's
    /// counters read now).
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        let mut s = *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        s.metrics = self.metrics.snapshot();
        s
    }
}

#[derive(Debug, Default)]
struct Sources {
    instances: Vec<(String, Weak<InstanceProbe>)>,
    coordinators: Vec<Weak<CoordinatorProbe>>,
}

/// The nodes a process serves metrics for, as one [`Collector`]: register
/// it in a [`Registry`] (or use [`registry`](Self::registry)) and encode
/// that with [`prometheus_client::encoding::text`] or
/// [`prometheus_client::encoding::prometheus_text`]. Nodes that stopped
/// drop out of the output.
///
/// Instance metrics are named `ferry_*` and labelled with the node's
/// `role` and the `node` name it was added under; coordinator metrics are
/// `ferry_coordinator_*`, labelled per `leg` (the sending role) and, for
/// failures, `reason`. Every label takes values from the configuration or
/// fixed lists, never from peers, so cardinality is what the operator
/// configured.
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    sources: Arc<Mutex<Sources>>,
}

impl Telemetry {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `probe`'s metrics labelled `node="<name>"`.
    pub fn add_instance(&self, probe: &Arc<InstanceProbe>, name: &str) {
        self.lock()
            .instances
            .push((name.to_owned(), Arc::downgrade(probe)));
    }

    /// Serves `probe`'s metrics.
    pub fn add_coordinator(&self, probe: &Arc<CoordinatorProbe>) {
        self.lock().coordinators.push(Arc::downgrade(probe));
    }

    /// A registry holding only this set.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        r.register_collector(Box::new(self.clone()));
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One instance's label values.
type InstanceLabels<'a> = [(&'static str, &'a str); 2];

fn counter(e: MetricEncoder<'_>, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e)
}

fn gauge(e: MetricEncoder<'_>, v: u64) -> std::fmt::Result {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(e)
}

impl Collector for Telemetry {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (instances, coordinators) = {
            let mut s = self.lock();
            s.instances.retain(|(_, w)| w.strong_count() > 0);
            s.coordinators.retain(|w| w.strong_count() > 0);
            let instances: Vec<(String, Arc<InstanceProbe>)> = s
                .instances
                .iter()
                .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?)))
                .collect();
            let coordinators: Vec<Arc<CoordinatorProbe>> =
                s.coordinators.iter().filter_map(Weak::upgrade).collect();
            (instances, coordinators)
        };
        if !instances.is_empty() {
            encode_instances(&mut encoder, &instances)?;
        }
        if !coordinators.is_empty() {
            encode_coordinators(&mut encoder, &coordinators)?;
        }
        Ok(())
    }
}

/// A counter of the runtime's: name (without `ferry_`/`_total`), help,
/// and how to read it.
type CounterRow = (&'static str, &'static str, fn(&MetricsSnapshot) -> u64);

/// The runtime counters both kinds of node keep.
const NODE_COUNTERS: [CounterRow; 6] = [
    ("messages_received", "Control messages received.", |m| {
        m.messages_in
    }),
    ("messages_sent", "Control messages sent.", |m| {
        m.messages_out
    }),
    (
        "messages_ignored",
        "Control messages the state machine ignored (late, duplicated, not for this node).",
        |m| m.ignored,
    ),
    (
        "bad_frames",
        "Frames dropped: not decodable, too large, malformed.",
        |m| m.bad_frames,
    ),
    ("send_errors", "Control sends that failed.", |m| {
        m.send_errors
    }),
    ("peers_lost", "Peers found gone.", |m| m.peers_lost),
];

/// The runtime counters only instances keep.
const INSTANCE_COUNTERS: [CounterRow; 9] = [
    (
        "other_frames",
        "Frames that were not transfer messages (the application's own, such as sglang's work items).",
        |m| m.non_transfer,
    ),
    ("requests_staged", "Requests staged and committed.", |m| m.staged),
    ("requests_sent", "Requests written to their receiver.", |m| m.sent),
    (
        "requests_send_failed",
        "Requests that failed before reaching their receiver.",
        |m| m.send_failed,
    ),
    ("transfers_received", "Transfers received.", |m| m.received),
    (
        "transfers_released",
        "Transfers released by the application.",
        |m| m.released,
    ),
    (
        "transfers_aborted",
        "Transfers the application held that the coordinator aborted.",
        |m| m.aborted,
    ),
    ("writes", "Writes posted to the data plane.", |m| m.writes),
    ("written_bytes", "Bytes written to peers.", |m| m.bytes_written),
];

/// A counter of the instance's state machine.
type StatsRow = (&'static str, &'static str, fn(&InstanceStats) -> u64);

/// The state machine's counters of what went wrong, or out of the way.
const INSTANCE_STATS: [StatsRow; 7] = [
    (
        "ferry_allocs_rejected",
        "Allocations this receiver rejected (no room, or a size its pool can never hold).",
        |s| s.rejected,
    ),
    (
        "ferry_requests_aborted",
        "Requests the coordinator aborted, in any state (the application's held ones: ferry_transfers_aborted_total).",
        |s| s.aborted,
    ),
    (
        "ferry_requests_timed_out",
        "Requests dropped by a local timeout (staged without a push, reserved without a ready).",
        |s| s.timed_out,
    ),
    (
        "ferry_requests_forwarded",
        "Requests received and staged for the next leg in one message.",
        |s| s.forwarded,
    ),
    (
        "ferry_allocs_held",
        "transfer_alloc messages held for lack of room (under sglang's head).",
        |s| s.allocs_held,
    ),
    (
        "ferry_writes_never_landed",
        "Transfers announced ready whose write was not seen to land in time.",
        |s| s.never_landed,
    ),
    (
        "ferry_state_queue_drops",
        "Messages, actions or events that found their queue full.",
        |s| s.dropped,
    ),
];

type GaugeRow = (&'static str, &'static str, fn(&InstanceGauges) -> u64);

const INSTANCE_GAUGES: [GaugeRow; 4] = [
    (
        "ferry_requests_held",
        "Requests held in any state, quarantined slots included.",
        |g| g.requests_held,
    ),
    (
        "ferry_prealloc_slots_in_use",
        "Preallocated receive slots in use.",
        |g| g.prealloc_in_use,
    ),
    ("ferry_prealloc_slots", "Preallocated receive slots.", |g| {
        g.prealloc_slots
    }),
    (
        "ferry_pool_slots_live",
        "Pool slots allocated, preallocated slots included.",
        |g| g.live_slots,
    ),
];

type InstanceLatencyRow = (&'static str, &'static str, fn(&InstanceProbe) -> &Latency);

const INSTANCE_LATENCIES: [InstanceLatencyRow; 3] = [
    (
        "ferry_send_queue",
        "Committed to transfer_push received: the wait for a receiver with room.",
        |p| &p.send_queue,
    ),
    (
        "ferry_write",
        "transfer_push received to the write's completion.",
        |p| &p.write,
    ),
    (
        "ferry_delivery_hold",
        "A delivery's arrival to its release by the application.",
        |p| &p.hold,
    ),
];

struct InstanceRow<'a> {
    labels: InstanceLabels<'a>,
    metrics: MetricsSnapshot,
    gauges: InstanceGauges,
    stats: InstanceStats,
    probe: &'a InstanceProbe,
}

fn encode_instances(
    encoder: &mut DescriptorEncoder<'_>,
    nodes: &[(String, Arc<InstanceProbe>)],
) -> std::fmt::Result {
    let rows: Vec<InstanceRow<'_>> = nodes
        .iter()
        .map(|(name, p)| {
            let (gauges, stats) = p.state();
            InstanceRow {
                labels: [("role", p.role()), ("node", name.as_str())],
                metrics: p.metrics.snapshot(),
                gauges,
                stats,
                probe: p,
            }
        })
        .collect();
    let mut name = String::new();
    for (short, help, read) in NODE_COUNTERS.iter().chain(&INSTANCE_COUNTERS) {
        name.clear();
        let _ = write!(name, "ferry_{short}");
        let mut m = encoder.encode_descriptor(&name, help, None, MetricType::Counter)?;
        for r in &rows {
            counter(m.encode_family(&r.labels)?, read(&r.metrics))?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "ferry_write_errors",
        "Writes that failed, by the data plane's kind of failure.",
        None,
        MetricType::Counter,
    )?;
    for r in &rows {
        for kind in FaultKind::ALL {
            let labels = (r.labels, [("kind", kind.as_name())]);
            counter(m.encode_family(&labels)?, r.probe.write_failures(kind))?;
        }
    }
    for (name, help, read) in INSTANCE_STATS {
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for r in &rows {
            counter(m.encode_family(&r.labels)?, read(&r.stats))?;
        }
    }
    for (name, help, read) in INSTANCE_GAUGES {
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for r in &rows {
            gauge(m.encode_family(&r.labels)?, read(&r.gauges))?;
        }
    }
    for (name, help, read) in INSTANCE_LATENCIES {
        let mut m =
            encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for r in &rows {
            read(r.probe)
                .histogram
                .encode(m.encode_family(&r.labels)?)?;
        }
    }
    Ok(())
}

/// The coordinator's counters from its state machine and runtime.
type CoordinatorRow = (&'static str, &'static str, fn(&CoordinatorSnapshot) -> u64);

const COORDINATOR_COUNTERS: [CoordinatorRow; 4] = [
    (
        "staged",
        "Legs staged (transfer_staged, or a forward's staged leg).",
        |s| s.stats.staged,
    ),
    (
        "fast_path",
        "Hand-offs that took a preallocated slot.",
        |s| s.stats.fast_path,
    ),
    (
        "forwarded",
        "Forwards received: a leg delivered and the next staged in one message.",
        |s| s.stats.forwarded,
    ),
    (
        "transmits_dropped",
        "Messages that could not be queued (the transmit queue was full).",
        |s| s.stats.transmits_dropped,
    ),
];

const COORDINATOR_GAUGES: [CoordinatorRow; 3] = [
    (
        "ferry_coordinator_instances",
        "Instances registered.",
        |s| s.members as u64,
    ),
    ("ferry_coordinator_in_flight", "Legs in flight.", |s| {
        s.in_flight as u64
    }),
    (
        "ferry_coordinator_prealloc_slots_taken",
        "Preallocated slots taken by legs in flight.",
        |s| s.prealloc_taken as u64,
    ),
];

type LegLatencyRow = (&'static str, &'static str, fn(&LegLatencies) -> &Latency);

const LEG_LATENCIES: [LegLatencyRow; 4] = [
    (
        "ferry_coordinator_handoff",
        "A leg's hand-off: transfer_staged received to transfer_ready sent.",
        |l| &l.handoff,
    ),
    (
        "ferry_coordinator_queue",
        "transfer_staged received to transfer_push sent: the wait for a receiver with room, its allocation included.",
        |l| &l.queue,
    ),
    (
        "ferry_coordinator_write",
        "transfer_push sent to transfer_pushed received: the sender's write.",
        |l| &l.write,
    ),
    (
        "ferry_coordinator_consume",
        "transfer_ready sent to transfer_done received: the receiver's hold of the slot.",
        |l| &l.consume,
    ),
];

fn encode_coordinators(
    encoder: &mut DescriptorEncoder<'_>,
    nodes: &[Arc<CoordinatorProbe>],
) -> std::fmt::Result {
    let snaps: Vec<CoordinatorSnapshot> = nodes.iter().map(|n| n.snapshot()).collect();
    let mut name = String::new();
    for (short, help, read) in &NODE_COUNTERS {
        name.clear();
        let _ = write!(name, "ferry_coordinator_{short}");
        let mut m = encoder.encode_descriptor(&name, help, None, MetricType::Counter)?;
        for s in &snaps {
            counter(m.encode_family(&NO_LABELS)?, read(&s.metrics))?;
        }
    }
    for (short, help, read) in COORDINATOR_COUNTERS {
        name.clear();
        let _ = write!(name, "ferry_coordinator_{short}");
        let mut m = encoder.encode_descriptor(&name, help, None, MetricType::Counter)?;
        for s in &snaps {
            counter(m.encode_family(&NO_LABELS)?, read(s))?;
        }
    }
    for (name, help, read) in COORDINATOR_GAUGES {
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for s in &snaps {
            gauge(m.encode_family(&NO_LABELS)?, read(s))?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "ferry_coordinator_handoffs",
        "Legs delivered, by the sending role.",
        None,
        MetricType::Counter,
    )?;
    for n in nodes {
        for (role, l) in n.pipeline.iter().zip(&n.legs) {
            counter(m.encode_family(&[("leg", role.as_str())])?, l.delivered())?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "ferry_coordinator_failures",
        "Legs failed, by the sending role and the reason.",
        None,
        MetricType::Counter,
    )?;
    for n in nodes {
        for (role, l) in n.pipeline.iter().zip(&n.legs) {
            for reason in FailReason::ALL {
                let labels = [("leg", role.as_str()), ("reason", reason.code())];
                counter(m.encode_family(&labels)?, l.failures(reason))?;
            }
        }
    }
    for (name, help, read) in LEG_LATENCIES {
        let mut m =
            encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for n in nodes {
            for (role, l) in n.pipeline.iter().zip(&n.legs) {
                read(l)
                    .histogram
                    .encode(m.encode_family(&[("leg", role.as_str())])?)?;
            }
        }
    }
    Ok(())
}

/// No labels, for a metric's only series.
const NO_LABELS: [(&str, &str); 0] = [];

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::{prometheus_text, text};

    fn scrape(t: &Telemetry) -> String {
        let mut out = String::new();
        text::encode(&mut out, &t.registry()).unwrap();
        out
    }

    #[test]
    fn nodes_are_series_of_one_family_each_and_leave_when_dropped() {
        let t = Telemetry::new();
        let a = Arc::new(InstanceProbe::new("encoder"));
        let b = Arc::new(InstanceProbe::new("decoder"));
        t.add_instance(&a, "enc-0");
        t.add_instance(&b, "dec-0");
        a.write.observe(Duration::from_micros(30));
        a.write_failed(FaultKind::Timeout);
        let out = scrape(&t);
        assert_eq!(
            out.matches("# TYPE ferry_write_seconds histogram").count(),
            1,
            "{out}"
        );
        assert!(
            out.contains(r#"ferry_write_seconds_count{role="encoder",node="enc-0"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"ferry_write_seconds_count{role="decoder",node="dec-0"} 0"#),
            "{out}"
        );
        // 30 µs falls in the 40 µs bucket, not the 20 µs one.
        assert!(
            out.contains(
                r#"ferry_write_seconds_bucket{le="0.00002",role="encoder",node="enc-0"} 0"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_write_seconds_bucket{le="0.00004",role="encoder",node="enc-0"} 1"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_write_errors_total{role="encoder",node="enc-0",kind="timeout"} 1"#
            ),
            "{out}"
        );
        assert!(out.ends_with("# EOF\n"), "{out}");
        drop(b);
        let out = scrape(&t);
        assert!(!out.contains("dec-0"), "{out}");
        let mut plain = String::new();
        prometheus_text::encode(&mut plain, &t.registry()).unwrap();
        assert!(
            plain.contains("# TYPE ferry_requests_sent_total counter"),
            "{plain}"
        );
        assert!(!plain.contains("# EOF"), "{plain}");
    }

    #[test]
    fn legs_carry_their_role_and_failures_their_reason() {
        let t = Telemetry::new();
        let c = Arc::new(CoordinatorProbe::new(&["encoder".into(), "decoder".into()]));
        t.add_coordinator(&c);
        let timing = LegTiming {
            queued: Duration::from_millis(1),
            written: Duration::from_millis(2),
            consumed: Duration::from_millis(4),
        };
        c.delivered(0, &timing);
        c.failed(0, FailReason::PushTimeout);
        // A leg past the pipeline is not counted anywhere (nor a panic).
        c.delivered(7, &timing);
        assert_eq!(c.legs[0].delivered(), 1);
        let h = c.legs[0].handoff.snapshot();
        assert_eq!(
            (h.count, h.min, h.max),
            (
                1,
                Some(Duration::from_millis(3)),
                Some(Duration::from_millis(3))
            )
        );
        let out = scrape(&t);
        assert!(
            out.contains(r#"ferry_coordinator_handoffs_total{leg="encoder"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_coordinator_failures_total{leg="encoder",reason="push_timeout"} 1"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"ferry_coordinator_handoff_seconds_sum{leg="encoder"} 0.003"#),
            "{out}"
        );
        assert!(
            out.contains(r#"ferry_coordinator_consume_seconds_sum{leg="encoder"} 0.004"#),
            "{out}"
        );
    }

    #[test]
    fn a_latency_without_observations_has_no_extremes() {
        let l = Latency::default();
        assert_eq!(l.snapshot(), LatencySnapshot::default());
        l.observe(Duration::from_nanos(5));
        l.observe(Duration::from_nanos(2));
        let s = l.snapshot();
        assert_eq!((s.count, s.sum), (2, Duration::from_nanos(7)));
        assert_eq!(
            (s.min, s.max),
            (Some(Duration::from_nanos(2)), Some(Duration::from_nanos(5)))
        );
    }
}
