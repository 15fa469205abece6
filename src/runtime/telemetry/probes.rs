//! What each node measures while it runs: an instance's counters, gauges
//! and latencies, a coordinator's per leg.

use super::*;

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
/// reads it ([`InstanceNode::probe`](crate::runtime::InstanceNode::probe)).
#[derive(Debug)]
pub struct InstanceProbe {
    pub(super) role: String,
    /// The runtime's counters.
    pub metrics: Metrics,
    /// Committed to `transfer_push` received: the wait for a receiver.
    pub send_queue: Latency,
    /// `transfer_push` received to the write's completion.
    pub write: Latency,
    /// A delivery's arrival to its release by the application.
    pub hold: Latency,
    pub(super) write_faults: [AtomicU64; FaultKind::ALL.len()],
    pub(super) state: Mutex<(InstanceGauges, InstanceStats)>,
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
    pub(super) delivered: AtomicU64,
    pub(super) failed: [AtomicU64; FailReason::ALL.len()],
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
/// reads it ([`CoordinatorNode::probe`](crate::runtime::CoordinatorNode::probe)).
#[derive(Debug)]
pub struct CoordinatorProbe {
    pub(super) pipeline: Vec<String>,
    /// The runtime's counters.
    pub metrics: Metrics,
    /// Per leg, in pipeline order of the sending role.
    pub legs: Vec<LegLatencies>,
    pub(super) snapshot: Mutex<CoordinatorSnapshot>,
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
