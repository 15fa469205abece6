//! What faults happen, and how often: one description read by both of
//! ferry's fault injectors. The runtime's (`tensorferry::fault`, wrapping
//! real transports and control channels) applies it on the wall clock; the
//! test harness's faulty wire (`tensorferry-harness`, under the simulation)
//! applies it on a virtual clock. Each applies what it can: a process the
//! runtime's tests started is theirs to kill, so `crash` and
//! `crash_after_write` are the simulation's alone, and its channels have
//! latency of their own, so `jitter` is an upper bound there.
//!
//! Plain data (probabilities from 0 to 1, durations and a seed), so that a
//! failing run, in either place, is replayed from the plan that made it.

use core::time::Duration;

/// Probabilities (0 to 1) and times of the faults to inject; the zero
/// plan ([`FaultPlan::NONE`], also `Default`) injects none.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultPlan {
    // ---- control messages ----
    /// A message is lost.
    pub drop: f64,
    /// A message is delivered twice.
    pub duplicate: f64,
    /// A message is held back by `delay` (so later ones overtake it).
    pub delay_message: f64,
    /// Every message is in transit for up to this long, drawn anew for
    /// each (so messages overtake one another). Zero: at once.
    pub jitter: Duration,

    // ---- writes ----
    /// A write fails: nothing is written, its completion is an error.
    pub fail_write: f64,
    /// A write takes long: its completion (and, in the simulation, its
    /// landing) comes late. The runtime holds it back by `delay`; the
    /// simulation lands it between half of `write_lifetime` and all of it
    /// after it was posted, long after its request may have failed.
    pub delay_write: f64,
    /// On a data plane that reports arrivals: a write's arrival is never
    /// reported (its bytes never come, or their notice is lost).
    pub lose_notice: f64,
    /// On a data plane that reports arrivals: a write's bytes come late,
    /// after its completion, up to the receiver's landing limit and into
    /// its quarantine (the simulation's; the runtime posts notices at
    /// once).
    pub late_notice: f64,
    /// How late a delayed write may land at most: the data plane's write
    /// lifetime, or longer for a plane that understates it (the
    /// simulation's; the runtime holds a delayed write `delay`).
    pub write_lifetime: Duration,

    // ---- processes (the simulation's) ----
    /// A scheduled crash happens: an instance stops dead, and restarts a
    /// little later as a new incarnation; so does a scheduled stop (a
    /// drain, then leaving).
    pub crash: f64,
    /// A write's sender crashes just after posting it; the write goes on
    /// without it, as an RDMA NIC's does.
    pub crash_after_write: f64,

    // ---- the schedule ----
    /// How long delayed writes and messages are held.
    pub delay: Duration,
    /// Seed of the fault schedule.
    pub seed: u64,
}

impl FaultPlan {
    /// No faults: every message once and at once, every write succeeds.
    pub const NONE: FaultPlan = FaultPlan {
        drop: 0.0,
        duplicate: 0.0,
        delay_message: 0.0,
        jitter: Duration::ZERO,
        fail_write: 0.0,
        delay_write: 0.0,
        lose_notice: 0.0,
        late_notice: 0.0,
        write_lifetime: Duration::ZERO,
        crash: 0.0,
        crash_after_write: 0.0,
        delay: Duration::ZERO,
        seed: 0,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_the_default() {
        assert_eq!(FaultPlan::NONE, FaultPlan::default());
    }
}
