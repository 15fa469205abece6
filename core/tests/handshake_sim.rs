//! A deterministic simulation of a coordinator and six instances
//! (encoder → denoiser → decoder, two of each) on a virtual clock, with
//! faults injected into the control plane (loss, duplication, delay and so
//! reordering), failed writes, instance crashes and restarts, and instances
//! stopped in good order (a drain, then `Instance::leave`, then a restart).
//!
//! A third of the seeds run on a data plane whose completions do not mean
//! delivery (as libfabric's `tcp` provider): the sender's write completes
//! before its bytes arrive, the receiver's data plane records each write
//! that arrived, and the instances (configured with a landing limit) hand
//! a transfer over only once its write is reported landed. Under faults
//! there, bytes also arrive late (some after the receiver's landing limit,
//! while its slot is quarantined) or never.
//!
//! Denoisers pass each request on in one of three ways, by seed: released
//! and staged again under a new id; forwarded under the same id
//! (`Instance::forward`: `transfer_staged` then `transfer_done`); or
//! forwarded by denoisers configured for sglang's head (`Head::Sglang`: one
//! `transfer_done{staged_for_decoder}`, a single registration, ALLOCs
//! without room held), which ferry's coordinator takes as well. A leg is
//! named by its request id and its sender's role.
//!
//! Every seed checks: every request ends (delivered or failed) within its
//! timeout bound; no slot leaks anywhere once the run drains; capacity is
//! back to zero everywhere; no write lands outside a slot reserved for its
//! request; and, with no faults, every request is delivered with every byte
//! as staged.
//!
//! `FERRY_SIM_SEEDS` and `FERRY_SIM_REQUESTS` scale the run.
//! `FERRY_SIM_ONLY=<seed>` runs one seed, `FERRY_SIM_TRACE=<seed>` prints
//! its events.
//!
//! The world, its events and the checks are in `sim/` (a `Sim` with one
//! method per job), over the `World` of the harness crate
//! (`core/harness`, `tensorferry-harness`) and its faulty wire.

use tensorferry_harness as harness;
mod sim;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use harness::Rng;
use sim::{run, Faults, Outcome, POOL, WRITE_LIFE};
use tensorferry_core::fault_plan::FaultPlan;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seeds to run: all of `0..FERRY_SIM_SEEDS`, or the one
/// `FERRY_SIM_ONLY` names.
fn seeds(at_least: u64) -> Vec<u64> {
    let seeds = env("FERRY_SIM_SEEDS", 10_000).max(at_least);
    let only: Option<u64> = std::env::var("FERRY_SIM_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    (0..seeds)
        .filter(|s| only.is_none_or(|o| o == *s))
        .collect()
}

/// Runs `one` for every seed on every core (the seeds are independent
/// worlds, so the whole run takes a core's share of the time), and sums
/// their outcomes. A seed's failed assertion fails the test with its
/// message.
fn on_all_cores(seeds: &[u64], one: impl Fn(u64) -> Outcome + Sync) -> Outcome {
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let partials: Vec<Outcome> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut sum = Outcome::default();
                    while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                        add(&mut sum, one(seed));
                    }
                    sum
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let mut totals = Outcome::default();
    for p in partials {
        add(&mut totals, p);
    }
    totals
}

fn add(totals: &mut Outcome, o: Outcome) {
    totals.staged += o.staged;
    totals.delivered += o.delivered;
    totals.failed += o.failed;
    totals.verified += o.verified;
    totals.never_landed += o.never_landed;
    totals.late_after_crash += o.late_after_crash;
    for (k, v) in o.reasons {
        *totals.reasons.entry(k).or_default() += v;
    }
}

#[test]
fn without_faults_every_request_is_delivered_intact() {
    let requests = env("FERRY_SIM_REQUESTS", 1_000) as usize;
    on_all_cores(&seeds(1), |seed| {
        // Every third seed on a data plane that reports arrivals.
        let faults = Faults {
            notify: seed % 3 == 2,
            ..Faults::NONE
        };
        let o = run(seed, requests, faults, POOL);
        assert_eq!(o.failed, 0, "seed {seed}: {o:?}");
        // Each encoder request is delivered to a denoiser and forwarded.
        assert_eq!(o.delivered, o.staged, "seed {seed}: {o:?}");
        assert_eq!(o.verified, o.staged, "seed {seed}: {o:?}");
        o
    });
}

#[test]
fn under_faults_every_request_ends_and_nothing_leaks() {
    let requests = env("FERRY_SIM_REQUESTS", 1_000) as usize;
    let seeds = seeds(0);
    let totals = on_all_cores(&seeds, |seed| {
        let mut rng = Rng(seed ^ 0xABCDEF);
        let plan = FaultPlan {
            drop: [0.0, 0.01, 0.05][rng.below(3) as usize],
            duplicate: [0.0, 0.02, 0.1][rng.below(3) as usize],
            jitter: Duration::from_millis([1, 5, 20][rng.below(3) as usize]),
            fail_write: [0.0, 0.05][rng.below(2) as usize],
            crash: [0.0, 1.0][rng.below(2) as usize],
            late_notice: [0.0, 0.05][rng.below(2) as usize],
            lose_notice: [0.0, 0.02][rng.below(2) as usize],
            delay_write: [0.0, 0.1][rng.below(2) as usize],
            crash_after_write: [0.0, 0.05][rng.below(2) as usize],
            write_lifetime: Duration::from_nanos(WRITE_LIFE),
            ..FaultPlan::NONE
        };
        let faults = Faults {
            plan,
            notify: seed % 3 == 2,
        };
        let pool = if seed % 2 == 0 { POOL } else { POOL / 8 };
        // Twice the requests of the fault-free runs: under faults about
        // half fail before they are forwarded.
        run(1_000_000 + seed, 2 * requests, faults, pool)
    });
    println!("{} seeds under faults: {totals:?}", seeds.len());
    assert!(totals.delivered > 0 && totals.failed > 0, "{totals:?}");
    // The notifying data plane's faults were met: transfers refused for
    // bytes that never came, or came after the landing limit.
    if seeds.len() >= 30 {
        assert!(totals.never_landed > 0, "{totals:?}");
        // And late writes of senders that crashed after posting them
        // landed, each inside the slot still kept for its request.
        assert!(totals.late_after_crash > 0, "{totals:?}");
    }
}

/// The check above can fail: where writes outlive what the instances were
/// told (a data plane that understates its write lifetime, so the
/// quarantine does not cover it), a late write of a failed request lands
/// in its slot's next tenant, and the simulation says so.
#[test]
fn writes_that_outlive_the_quarantine_are_caught_landing_in_the_next_tenant() {
    let caught = (0..200u64).find_map(|seed| {
        let faults = Faults {
            plan: FaultPlan {
                delay_write: 0.3,
                crash_after_write: 0.1,
                // Past the coordinator's push timeout and the quarantine.
                write_lifetime: Duration::from_millis(300),
                ..Faults::NONE.plan
            },
            ..Faults::NONE
        };
        let outcome = std::panic::catch_unwind(|| run(2_000_000 + seed, 300, faults, POOL / 8));
        outcome
            .err()
            .map(|panic| panic.downcast_ref::<String>().cloned().unwrap_or_default())
    });
    let message = caught.expect("some seed lands a late write in another request's slot");
    assert!(
        message.contains("outside any slot reserved for it"),
        "{message}"
    );
}
