//! The exposition's tables: each metric's name, help and how it is read
//! from a node, and the encoding of instances and coordinators through
//! them.

use prometheus_client::encoding::EncodeLabelSet;

use super::*;

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

pub(super) fn encode_instances(
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
        values(encoder, (name.as_str(), help, Kind::Counter), &rows, |r| {
            (&r.labels, read(&r.metrics))
        })?;
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
        values(encoder, (name, help, Kind::Counter), &rows, |r| {
            (&r.labels, read(&r.stats))
        })?;
    }
    for (name, help, read) in INSTANCE_GAUGES {
        values(encoder, (name, help, Kind::Gauge), &rows, |r| {
            (&r.labels, read(&r.gauges))
        })?;
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

pub(super) fn encode_coordinators(
    encoder: &mut DescriptorEncoder<'_>,
    nodes: &[(String, Arc<CoordinatorProbe>)],
) -> std::fmt::Result {
    let snaps: Vec<(NodeLabel<'_>, CoordinatorSnapshot)> = nodes
        .iter()
        .map(|(name, n)| ([("node", name.as_str())], n.snapshot()))
        .collect();
    let mut name = String::new();
    for (short, help, read) in &NODE_COUNTERS {
        name.clear();
        let _ = write!(name, "ferry_coordinator_{short}");
        values(
            encoder,
            (name.as_str(), help, Kind::Counter),
            &snaps,
            |(labels, s)| (labels, read(&s.metrics)),
        )?;
    }
    for (short, help, read) in COORDINATOR_COUNTERS {
        name.clear();
        let _ = write!(name, "ferry_coordinator_{short}");
        values(
            encoder,
            (name.as_str(), help, Kind::Counter),
            &snaps,
            |(labels, s)| (labels, read(s)),
        )?;
    }
    for (name, help, read) in COORDINATOR_GAUGES {
        values(encoder, (name, help, Kind::Gauge), &snaps, |(labels, s)| {
            (labels, read(s))
        })?;
    }
    let mut m = encoder.encode_descriptor(
        "ferry_coordinator_handoffs",
        "Legs delivered, by the sending role.",
        None,
        MetricType::Counter,
    )?;
    for (node, n) in nodes {
        for (role, l) in n.pipeline.iter().zip(&n.legs) {
            counter(m.encode_family(&leg_labels(node, role))?, l.delivered())?;
        }
    }
    let mut m = encoder.encode_descriptor(
        "ferry_coordinator_failures",
        "Legs failed, by the sending role and the reason.",
        None,
        MetricType::Counter,
    )?;
    for (node, n) in nodes {
        for (role, l) in n.pipeline.iter().zip(&n.legs) {
            for reason in FailReason::ALL {
                let labels = (leg_labels(node, role), [("reason", reason.code())]);
                counter(m.encode_family(&labels)?, l.failures(reason))?;
            }
        }
    }
    for (name, help, read) in LEG_LATENCIES {
        let mut m =
            encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for (node, n) in nodes {
            for (role, l) in n.pipeline.iter().zip(&n.legs) {
                read(l)
                    .histogram
                    .encode(m.encode_family(&leg_labels(node, role))?)?;
            }
        }
    }
    Ok(())
}

/// A family's kind: a counter or a gauge.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// A family of plain values, `name` with `help`, of `kind`: one sample a
/// row of `rows`, its labels and value as `sample` reads them.
fn values<R, L: EncodeLabelSet>(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help, kind): (&str, &str, Kind),
    rows: &[R],
    sample: impl Fn(&R) -> (&L, u64),
) -> std::fmt::Result {
    let metric_type = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
    };
    let mut m = encoder.encode_descriptor(name, help, None, metric_type)?;
    for r in rows {
        let (labels, v) = sample(r);
        match kind {
            Kind::Counter => counter(m.encode_family(labels)?, v)?,
            Kind::Gauge => gauge(m.encode_family(labels)?, v)?,
        }
    }
    Ok(())
}

/// A coordinator's label: the name it was added under.
type NodeLabel<'a> = [(&'static str, &'a str); 1];

/// The labels of one leg of a coordinator.
fn leg_labels<'a>(node: &'a str, role: &'a str) -> [(&'static str, &'a str); 2] {
    [("node", node), ("leg", role)]
}
