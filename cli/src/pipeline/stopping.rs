//! How a `ferry instance` or `ferry coordinator` stops when asked
//! ([`Lifetime`]): it stops taking work (readiness goes down, the node
//! drains), lets what is in flight finish within the grace period
//! (`--drain-timeout`), fails the rest with a reason the coordinator and the
//! peers see, and reports how it went in its summary. A second signal cuts
//! the grace period short. What the node does at each step is decided in
//! tensorferry-core (`Instance::drain`, `Instance::leave`, `Coordinator::drain`,
//! `Coordinator::shutdown`); this only keeps the time.

use std::time::{Duration, Instant};

use serde_json::json;
use tensorferry::runtime::{CoordinatorNode, InstanceNode};

use super::roles::emit_json;
use crate::lifetime::{Cause, Lifetime, Stop};
use crate::metrics_http::Readiness;

/// How long leaving waits for the writes still posted to end.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The name of why the process stops, for reports.
fn cause_name(life: &Lifetime) -> String {
    life.cause()
        .map_or_else(|| "unknown".to_owned(), Cause::name)
}

/// An instance's way out, driven from its role's loop: call
/// [`keep_going`](Self::keep_going) each turn, and [`leave`](Self::leave)
/// once it says no.
pub(crate) struct Ending<'n> {
    life: &'n Lifetime,
    node: &'n InstanceNode,
    grace: Duration,
    ready: Readiness,
    /// When the drain's grace period ends (`None`: no drain began).
    deadline: Option<Instant>,
}

impl<'n> Ending<'n> {
    /// The ending of `node`, with `grace` to drain in; `ready` is what
    /// `/readyz` answers.
    pub(crate) fn new(
        life: &'n Lifetime,
        node: &'n InstanceNode,
        grace: Duration,
        ready: Readiness,
    ) -> Self {
        Self {
            life,
            node,
            grace,
            ready,
            deadline: None,
        }
    }

    /// True while nothing asks the process to stop: it may take new work.
    pub(crate) fn taking_work(&mut self) -> bool {
        self.keep_going() && self.deadline.is_none()
    }

    /// True while the role's loop should go on: nothing asks the process
    /// to stop, or it drains with work in flight and time left. The first
    /// turn after a stop was asked for begins the drain.
    pub(crate) fn keep_going(&mut self) -> bool {
        let stop = self.life.stop();
        self.ready
            .set(stop == Stop::Run && self.node.is_registered());
        match stop {
            Stop::Run => true,
            Stop::Now => false,
            Stop::Drain => {
                let now = Instant::now();
                let deadline = match self.deadline {
                    Some(d) => d,
                    None => {
                        self.node.drain();
                        emit_json(&json!({
                            "event": "draining",
                            "cause": cause_name(self.life),
                            "in_flight": self.node.in_flight(),
                            "drain_timeout_s": self.grace.as_secs_f64(),
                        }));
                        let d = now + self.grace;
                        self.deadline = Some(d);
                        d
                    }
                };
                !self.node.is_drained() && now < deadline
            }
        }
    }

    /// True unless waiting must end: a second signal came, or the drain's
    /// grace period is over.
    pub(crate) fn patient(&self) -> bool {
        self.life.stop() != Stop::Now && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Sleeps up to `wait`, or until a stop is asked for.
    pub(crate) fn sleep(&self, wait: Duration) {
        self.life.sleep(wait);
    }

    /// Ends the node's part in everything (what is still in flight fails,
    /// the coordinator and peers told) and returns what the summary says
    /// of the stop.
    pub(crate) fn leave(&mut self) -> serde_json::Value {
        self.ready.set(false);
        let in_flight = self.node.in_flight();
        let drained = self.node.is_drained();
        let cause = cause_name(self.life);
        let reason = if drained {
            format!("instance stopped ({cause})")
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            format!(
                "instance stopped ({cause}): {in_flight} still in flight after its {} s drain",
                self.grace.as_secs_f64()
            )
        } else {
            format!("instance stopped ({cause}) before its drain ended")
        };
        // The data plane ends every write within its write timeout; past
        // this the writes are abandoned to the node's drop.
        let left = self.node.leave(&reason, LEAVE_TIMEOUT);
        json!({
            "cause": cause,
            "drained": drained,
            "failed_at_stop": in_flight,
            "left": left,
        })
    }
}

/// Waits for the coordinator to answer the registration (up to
/// `patience`), a stop cutting the wait short: `Ok(true)` registered,
/// `Ok(false)` stopped first.
pub(crate) fn await_registration(
    node: &InstanceNode,
    life: &Lifetime,
    patience: Duration,
) -> Result<bool, tensorferry::runtime::NodeError> {
    let end = Instant::now() + patience;
    loop {
        if !life.running() {
            return Ok(false);
        }
        let step = end
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        match node.wait_registered(step) {
            Ok(()) => return Ok(true),
            Err(tensorferry::runtime::NodeError::NotRegistered(_)) if Instant::now() < end => {}
            Err(tensorferry::runtime::NodeError::NotRegistered(_)) => {
                return Err(tensorferry::runtime::NodeError::NotRegistered(patience))
            }
            Err(e) => return Err(e),
        }
    }
}

/// The coordinator's way out, once a stop was asked for: no new work,
/// what is in flight finishes within `grace` (or until a second signal),
/// the rest fails with every instance involved told. Returns what the
/// summary says of the stop.
pub(crate) fn stop_coordinator(
    node: &CoordinatorNode,
    life: &Lifetime,
    grace: Duration,
    ready: &Readiness,
) -> serde_json::Value {
    ready.set(false);
    let cause = cause_name(life);
    node.drain();
    emit_json(&json!({
        "event": "draining",
        "cause": cause,
        "in_flight": node.in_flight(),
        "drain_timeout_s": grace.as_secs_f64(),
    }));
    let deadline = Instant::now() + grace;
    // The node's figures trail its thread by one turn: give it one.
    std::thread::sleep(Duration::from_millis(25));
    while node.in_flight() > 0 && Instant::now() < deadline && life.stop() != Stop::Now {
        life.sleep(Duration::from_millis(10));
    }
    let in_flight = node.in_flight();
    node.shutdown(Duration::from_secs(2));
    json!({
        "cause": cause,
        "drained": in_flight == 0,
        "failed_at_stop": in_flight,
    })
}
