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

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tensorferry_core::handshake::coordinator::{FailReason, LegTiming};
use tensorferry_core::handshake::instance::{InstanceStats, SendTiming};
use tensorferry_core::transport::FaultKind;

use super::coordinator::CoordinatorSnapshot;
use super::metrics::{Metrics, MetricsSnapshot};

mod exposition;
mod latency;
mod probes;

use exposition::{encode_coordinators, encode_instances};
pub use latency::{latency_buckets, Latency, LatencySnapshot};
pub use probes::{CoordinatorProbe, InstanceGauges, InstanceProbe, LegLatencies};

/// The kept library the exposition goes through, re-exported so that an
/// embedding runtime registers [`Telemetry`] in a [`Registry`] of the same
/// version.
pub use prometheus_client;

#[derive(Debug, Default)]
struct Sources {
    instances: Vec<(String, Weak<InstanceProbe>)>,
    coordinators: Vec<(String, Weak<CoordinatorProbe>)>,
}

/// The nodes a process serves metrics for, as one [`Collector`]: register
/// it in a [`Registry`] (or use [`registry`](Self::registry)) and encode
/// that with [`prometheus_client::encoding::text`] or
/// [`prometheus_client::encoding::prometheus_text`]. Nodes that stopped
/// drop out of the output.
///
/// Instance metrics are named `ferry_*` and labelled with the node's
/// `role` and the `node` name it was added under; coordinator metrics are
/// `ferry_coordinator_*`, labelled with the `node` name it was added under
/// and, per leg, `leg` (the sending role) and, for failures, `reason`.
/// Nodes of one kind need names of their own: two under one name would
/// make the same series twice. Every label takes values from the
/// configuration or fixed lists, never from peers, so cardinality is what
/// the operator configured.
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

    /// Serves `probe`'s metrics labelled `node="<name>"`.
    pub fn add_coordinator(&self, probe: &Arc<CoordinatorProbe>, name: &str) {
        self.lock()
            .coordinators
            .push((name.to_owned(), Arc::downgrade(probe)));
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
            s.coordinators.retain(|(_, w)| w.strong_count() > 0);
            let instances: Vec<(String, Arc<InstanceProbe>)> = s
                .instances
                .iter()
                .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?)))
                .collect();
            let coordinators: Vec<(String, Arc<CoordinatorProbe>)> = s
                .coordinators
                .iter()
                .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?)))
                .collect();
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
#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::{prometheus_text, text};

    /// A leg's timing: queued 1 ms, written 2 ms, consumed 4 ms.
    const TIMING: LegTiming = LegTiming {
        queued: Duration::from_millis(1),
        written: Duration::from_millis(2),
        consumed: Duration::from_millis(4),
    };

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
        t.add_coordinator(&c, "coord-0");
        c.delivered(0, &TIMING);
        c.failed(0, FailReason::PushTimeout);
        // A leg past the pipeline is not counted anywhere (nor a panic).
        c.delivered(7, &TIMING);
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
            out.contains(r#"ferry_coordinator_handoffs_total{node="coord-0",leg="encoder"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_coordinator_failures_total{node="coord-0",leg="encoder",reason="push_timeout"} 1"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_coordinator_handoff_seconds_sum{node="coord-0",leg="encoder"} 0.003"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"ferry_coordinator_consume_seconds_sum{node="coord-0",leg="encoder"} 0.004"#
            ),
            "{out}"
        );
    }

    /// What makes `text` (OpenMetrics, or Prometheus' text format 0.0.4)
    /// an invalid exposition, by the rules both formats share: each
    /// family's metadata once, its samples together under it, every sample
    /// (name and label set) once, `# EOF` last if at all.
    fn exposition_errors(text: &str) -> Vec<String> {
        use std::collections::HashSet;
        const SUFFIXES: [&str; 6] = ["", "_total", "_bucket", "_count", "_sum", "_created"];
        let mut errors = Vec::new();
        let mut families: HashSet<String> = HashSet::new();
        let mut samples: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
        let mut family = String::new();
        let mut ended = false;
        for line in text.lines() {
            if ended {
                errors.push(format!("after # EOF: {line}"));
            }
            if line == "# EOF" {
                ended = true;
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                let mut words = meta.splitn(3, ' ');
                let (Some(_kind), Some(name)) = (words.next(), words.next()) else {
                    errors.push(format!("metadata without a name: {line}"));
                    continue;
                };
                if name != family {
                    if !families.insert(name.to_owned()) {
                        errors.push(format!("family {name} appears twice"));
                    }
                    family = name.to_owned();
                }
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..end];
            if !SUFFIXES
                .iter()
                .any(|s| name.strip_suffix(s) == Some(family.as_str()))
            {
                errors.push(format!("{name} outside its family (in {family})"));
            }
            let mut labels = Vec::new();
            let mut rest = &line[end..];
            if let Some(body) = rest.strip_prefix('{') {
                let mut chars = body.char_indices();
                let mut key = String::new();
                let mut closed = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '}' => {
                            closed = Some(i);
                            break;
                        }
                        ',' => {}
                        '=' => {
                            if chars.next().map(|(_, c)| c) != Some('"') {
                                errors.push(format!("unquoted label value: {line}"));
                                break;
                            }
                            let mut value = String::new();
                            while let Some((_, c)) = chars.next() {
                                match c {
                                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                                    '"' => break,
                                    c => value.push(c),
                                }
                            }
                            labels.push((std::mem::take(&mut key), value));
                        }
                        c => key.push(c),
                    }
                }
                let Some(i) = closed else {
                    errors.push(format!("unclosed labels: {line}"));
                    continue;
                };
                rest = &body[i + 1..];
            }
            if rest.trim().split(' ').next().is_none_or(|v| v.is_empty()) {
                errors.push(format!("no value: {line}"));
            }
            labels.sort();
            if !samples.insert((name.to_owned(), labels)) {
                errors.push(format!("duplicate series: {line}"));
            }
        }
        errors
    }

    #[test]
    fn the_exposition_check_finds_a_series_given_twice() {
        let twice = "# HELP a_total x\n# TYPE a_total counter\na_total{b=\"1\",c=\"2\"} 1\n\
                     a_total{c=\"2\",b=\"1\"} 2\n";
        assert_eq!(exposition_errors(twice).len(), 1, "{twice}");
        let apart = "# TYPE a counter\na_total 1\n# TYPE b gauge\nb 1\n# TYPE a counter\n";
        assert_eq!(exposition_errors(apart).len(), 1, "{apart}");
    }

    #[test]
    fn two_coordinators_in_one_registry_make_a_valid_exposition() {
        let t = Telemetry::new();
        let pipeline = ["encoder".to_owned(), "decoder".to_owned()];
        let a = Arc::new(CoordinatorProbe::new(&pipeline));
        let b = Arc::new(CoordinatorProbe::new(&pipeline));
        t.add_coordinator(&a, "coord-a");
        t.add_coordinator(&b, "coord-b");
        let (enc, dec) = (
            Arc::new(InstanceProbe::new("encoder")),
            Arc::new(InstanceProbe::new("decoder")),
        );
        t.add_instance(&enc, "enc-0");
        t.add_instance(&dec, "dec-0");
        b.delivered(0, &TIMING);
        b.failed(1, FailReason::PushTimeout);
        let open = scrape(&t);
        assert_eq!(exposition_errors(&open), Vec::<String>::new(), "{open}");
        let mut plain = String::new();
        prometheus_text::encode(&mut plain, &t.registry()).unwrap();
        assert_eq!(exposition_errors(&plain), Vec::<String>::new(), "{plain}");
        // Each coordinator's figures are its own.
        for (node, n) in [("coord-a", 0), ("coord-b", 1)] {
            let handoffs =
                format!(r#"ferry_coordinator_handoffs_total{{node="{node}",leg="encoder"}} {n}"#);
            assert!(open.contains(&handoffs), "{handoffs} in {open}");
            let in_flight = format!(r#"ferry_coordinator_in_flight{{node="{node}"}} 0"#);
            assert!(open.contains(&in_flight), "{in_flight} in {open}");
        }
        assert!(
            open.contains(
                r#"ferry_coordinator_failures_total{node="coord-b",leg="decoder",reason="push_timeout"} 1"#
            ),
            "{open}"
        );
        // A coordinator that stopped leaves the other's series as they were.
        drop(a);
        let open = scrape(&t);
        assert!(!open.contains("coord-a"), "{open}");
        assert_eq!(exposition_errors(&open), Vec::<String>::new(), "{open}");
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
