//! The simulation of `handshake_sim.rs`: what a seed sets up (the faults,
//! the data plane, how denoisers pass requests on), the [`Sim`] that runs
//! it in the harness's [`World`] over its faulty wire, and the checks once
//! it has drained. The world carries the control messages and fires the
//! timers; the simulation's own events (its data plane's writes, the
//! applications, crashes and stops) are handled in [`events`], what the
//! machines emitted is booked and checked in [`output`].

mod events;
mod output;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tensorferry_core::fault_plan::FaultPlan;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Instant, Limits};

use crate::harness::{self, Faulty, Rng, World};
use events::Ev;

pub const ROLES: [&str; 3] = ["encoder", "denoiser", "decoder"];
pub const PER_ROLE: usize = 2;
pub const N: usize = ROLES.len() * PER_ROLE;
pub const MIN_BLOCK: u64 = 512;
/// The largest pool; seeds under faults also run with an eighth of it,
/// tight enough for allocations to be rejected.
pub const POOL: u64 = 512 * MIN_BLOCK;
const PREALLOC: Prealloc = Prealloc {
    count: 2,
    size: 8 * MIN_BLOCK,
};

/// The one timeout of the sglang head the sglang-configured denoisers
/// serve under (its `--disagg-timeout`), scaled to the simulation's
/// clock: their timeouts follow from it by
/// [`InstanceConfig::under_sglang`], as the runtime's do.
const SGLANG_HEAD: Duration = Duration::from_millis(100);
pub const MS: u64 = 1_000_000;

/// How long a receiver on a notifying data plane waits for a write to land
/// after `transfer_ready`, and how long its slots sit out a quarantine at
/// least (longer where the data plane's write lifetime needs it: see
/// [`InstanceConfig::quarantine_for`]).
const LANDING: u64 = 30 * MS;
const QUARANTINE: u64 = 40 * MS;

/// How long after it is posted a write may complete, at most, as the
/// simulated data plane tells its instances.
pub const WRITE_LIFE: u64 = 15 * MS;

/// On a notifying data plane: how long after its completion a write's
/// bytes may still arrive (past the receiver's landing limit, into its
/// quarantine). Its write lifetime is both.
const LATE_ARRIVAL: u64 = LANDING + QUARANTINE / 2;

/// Where the instances send the coordinator their messages.
const COORDINATOR: &str = "tcp://coordinator:5555";

/// A seed's faults: the core's [`FaultPlan`] (the runtime's fault
/// injector reads the same), and whether its data plane reports arrivals.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// What goes wrong, and how often.
    pub plan: FaultPlan,
    /// The data plane reports arrivals (completions do not mean delivery).
    pub notify: bool,
}

impl Faults {
    /// No faults: messages in transit up to 2 ms (so reordered all the
    /// same), writes within the data plane's write lifetime.
    pub const NONE: Faults = Faults {
        plan: FaultPlan {
            jitter: Duration::from_millis(2),
            write_lifetime: Duration::from_nanos(WRITE_LIFE),
            ..FaultPlan::NONE
        },
        notify: false,
    };

    fn max_delay(&self) -> u64 {
        ns(self.plan.jitter)
    }
}

/// What one seed produced.
#[derive(Default, Debug)]
pub struct Outcome {
    pub reasons: HashMap<String, usize>,
    pub staged: usize,
    pub delivered: usize,
    pub failed: usize,
    pub verified: usize,
    /// Transfers refused because their write was not seen to land in time.
    pub never_landed: u64,
    /// Late writes that landed after their sender had crashed.
    pub late_after_crash: usize,
}

/// One leg of a request: its id and the role index of the leg's sender
/// (a forward keeps the id, so the id alone does not name the leg).
type Leg = (String, usize);

/// How the seed's denoisers pass a request on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forwarding {
    /// Release, then stage under a new id (`{id}/d`).
    NewId,
    /// `Instance::forward` under the same id, serving ferry's coordinator
    /// (`transfer_staged` then `transfer_done`).
    Forward,
    /// `Instance::forward` under the same id from denoisers configured for
    /// sglang's head: the one message, `transfer_done{staged_for_decoder}`,
    /// one registration, ALLOCs without room held, releases unreported.
    SglangDenoisers,
}

/// What an instance's pool and data plane are like.
#[derive(Clone, Copy)]
struct Plane {
    /// The pool's size.
    pool: u64,
    /// The instance's landing limit, where the data plane reports arrivals.
    landing: Option<Duration>,
    /// How long after it is posted a write may still land, as the plane
    /// tells its instances (their quarantine covers it).
    write_lifetime: Duration,
}

/// What the simulation keeps of one instance's place (its machine, its
/// incarnation and whether it runs are the world's): its pool's bytes, its
/// data-plane session, what it staged.
struct Node {
    pool: Vec<u8>,
    session: String,
    /// The legs this incarnation staged.
    staged: Vec<Leg>,
    /// Its role's index in the pipeline.
    role: usize,
}

/// What the simulation knows of every leg: what was staged, when it was
/// first seen and where it ended; and the outcome so far.
#[derive(Default)]
struct Ledger {
    out: Outcome,
    first_seen: HashMap<Leg, u64>,
    expected: HashMap<Leg, Vec<u8>>,
    /// Legs that ended at their sender: never seen by the coordinator
    /// (staged timeout), or their sender crashed.
    ended_at_sender: HashSet<Leg>,
    ended_at_coord: HashSet<Leg>,
    staged_at: HashMap<Leg, u64>,
    staged_count: usize,
}

/// What a seed sets up: its faults, its data plane, how its denoisers
/// pass requests on, and where its instances are.
struct Setup {
    faults: Faults,
    forwarding: Forwarding,
    plane: Plane,
    endpoints: Vec<String>,
    roles: Vec<&'static str>,
}

/// A coordinator and `N` instances in the harness's world, on its virtual
/// clock, with the seed's faults on the wire between them.
struct Sim {
    seed: u64,
    /// The applications' draws (the wire draws its own).
    rng: Rng,
    trace: bool,
    setup: Setup,
    /// A request may live at most this long at the coordinator.
    bound: u64,
    /// And at its sender.
    sender_bound: u64,
    world: World<'static, Faulty, Ev>,
    nodes: Vec<Node>,
    crashes_left: [u32; N],
    ledger: Ledger,
}

/// Runs one seed: `requests` requests staged by the encoders, under
/// `faults`, with pools of `pool` bytes.
pub fn run(seed: u64, requests: usize, faults: Faults, pool: u64) -> Outcome {
    let mut sim = Sim::new(seed, faults, pool);
    sim.schedule(requests);
    sim.run();
    sim.finish()
}

/// A request's bytes: a function of its id (hashed once; hashing it for
/// every byte cost most of the simulation's time).
fn pattern(id: &str, len: usize) -> Vec<u8> {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    // Byte i depends on i mod 256 only: one period, repeated.
    let period: Vec<u8> = (0..256)
        .map(|i| (h >> (i % 8 * 8)) as u8 ^ (i as u8))
        .collect();
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        let take = (len - data.len()).min(period.len());
        data.extend_from_slice(&period[..take]);
    }
    data
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

impl Sim {
    /// The seed's world: its coordinator and instances, none of them
    /// started talking yet.
    fn new(seed: u64, faults: Faults, pool: u64) -> Sim {
        let rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let trace = std::env::var("FERRY_SIM_TRACE").is_ok_and(|v| v == seed.to_string());
        let forwarding = match seed % 3 {
            0 => Forwarding::NewId,
            1 => Forwarding::Forward,
            _ => Forwarding::SglangDenoisers,
        };
        let timeouts = Timeouts {
            queued: Duration::from_millis(400),
            alloc: Duration::from_millis(50),
            push: Duration::from_millis(60),
            done: Duration::from_millis(80),
        };
        let cconfig = CoordinatorConfig {
            policy: if seed % 2 == 0 {
                Policy::RoundRobin
            } else {
                Policy::MostFreeSlots
            },
            capacity_per_instance: 4,
            timeouts,
            retry_backoff: Duration::from_millis(5),
            max_attempts: 4,
            quarantine: Duration::from_nanos(QUARANTINE),
            message_delay: Duration::from_nanos(faults.max_delay()),
            max_write_lifetime: CoordinatorConfig::FERRY.max_write_lifetime,
            late_done_wait: Duration::from_millis(200),
        };
        let bound = ns(timeouts.queued)
            + 4 * (ns(timeouts.alloc) + 4 * 5 * MS)
            + ns(timeouts.push)
            + ns(timeouts.done)
            + 10 * MS;
        let limits = Limits {
            requests: 256,
            nested_per_request: 512,
            tombstones: 1024,
            members: N + 2,
            prealloc_per_member: 4,
        };
        let coord = harness::coordinator(&ROLES, cconfig, &limits);

        let endpoints: Vec<String> = (0..N).map(|i| format!("tcp://10.0.0.{i}:5555")).collect();
        let roles: Vec<&'static str> = (0..N).map(|i| ROLES[i / PER_ROLE]).collect();
        let plane = Plane {
            pool,
            landing: faults.notify.then_some(Duration::from_nanos(LANDING)),
            write_lifetime: Duration::from_nanos(if faults.notify {
                WRITE_LIFE + LATE_ARRIVAL
            } else {
                WRITE_LIFE
            }),
        };
        let setup = Setup {
            faults,
            forwarding,
            plane,
            endpoints,
            roles,
        };
        let mut insts = Vec::new();
        let mut nodes = Vec::new();
        for i in 0..N {
            let (inst, session) = setup.instance(i, 0, 0);
            insts.push(inst);
            nodes.push(Node {
                pool: vec![0; POOL as usize],
                session,
                staged: Vec::new(),
                role: i / PER_ROLE,
            });
        }
        let plan = FaultPlan {
            seed,
            ..faults.plan
        };
        let mut world = World::with_wire(coord, insts, Faulty::new(plan), false);
        world.via = COORDINATOR.to_owned();
        world.keep_arrivals = true;
        // As the runtime's coordinator, which names senders by endpoint.
        world.judge = false;
        world.by_number = false;
        world.trace = trace;
        Sim {
            seed,
            rng,
            trace,
            setup,
            bound,
            sender_bound: bound.max(1500 * MS) + 10 * MS,
            world,
            nodes,
            crashes_left: [3u32; N],
            ledger: Ledger::default(),
        }
    }

    /// What the seed asks for up front: registrations, `requests` staged
    /// at random times, and (under faults) crashes and stops.
    fn schedule(&mut self, requests: usize) {
        // Encoders stage requests at random times over the first second or so.
        for _ in 0..requests {
            // Spread over a second (longer for long runs): queues form, drain.
            let at = self.rng.below(MS * 1000u64.max(requests as u64 / 2));
            let i = self.rng.below(PER_ROLE as u64) as usize;
            self.world.schedule_at(at, Ev::Stage { i });
        }
        if self.setup.faults.plan.crash > 0.0 {
            for _ in 0..3 {
                let at = self.rng.below(1000 * MS);
                let i = self.rng.below(N as u64) as usize;
                self.world.schedule_at(at, Ev::Crash { i });
            }
            for _ in 0..2 {
                let at = self.rng.below(1000 * MS);
                let i = self.rng.below(N as u64) as usize;
                self.world.schedule_at(at, Ev::Stop { i });
            }
        }
    }

    /// Runs until nothing is left to happen: each thing that happens in
    /// the world (a message arriving, timers firing, or one of the
    /// simulation's events, handled here), then the output of the
    /// machines it touched, booked and checked.
    fn run(&mut self) {
        self.book();
        let mut steps = 0u64;
        while let Some(ev) = self.world.step() {
            steps += 1;
            assert!(
                steps < 50_000_000,
                "seed {}: simulation does not settle",
                self.seed
            );
            if let Some(ev) = ev {
                if self.trace {
                    events::trace(self.now(), &ev);
                }
                self.handle(ev);
            }
            self.world.drain();
            self.book();
        }
    }

    /// The virtual clock: when what is being handled happens.
    fn now(&self) -> u64 {
        self.world.now.0
    }
}

impl Setup {
    /// Instance `i`'s incarnation `inc`, started at `now` with the seed's
    /// data plane, serving under the head the seed gives its role; and its
    /// data-plane session.
    fn instance(&self, i: usize, inc: u32, now: u64) -> (Instance<'static>, String) {
        let Plane {
            pool,
            landing,
            write_lifetime,
        } = self.plane;
        let session = format!("sess-{i}-{inc}");
        let who = InstanceIdentity {
            role: self.roles[i],
            session_id: &session,
            work_endpoint: &self.endpoints[i],
            coordinator: COORDINATOR,
            pool_ptr: pool_ptr(i, inc),
            pool_size: pool,
            delivery_complete: landing.is_none(),
            write_lifetime,
        };
        let ferry = InstanceConfig {
            min_block: MIN_BLOCK,
            prealloc: PREALLOC,
            register_retry: Duration::from_millis(20),
            staged_timeout: Duration::from_millis(1500),
            reserved_timeout: Duration::from_millis(1500),
            quarantine: Duration::from_nanos(QUARANTINE),
            message_delay: self.faults.plan.jitter,
            landing_timeout: landing.unwrap_or(Duration::from_millis(100)),
            head: Head::Ferry,
            alloc_hold: Duration::from_millis(100),
        }
        // Derived from the data plane's write lifetime, as the runtime's.
        .quarantine_for(write_lifetime);
        // Under sglang's head, the policy the runtime uses, for a head whose
        // one timeout is `SGLANG_HEAD`: a held ALLOC outlives the
        // coordinator's alloc timeout and more (its patience under faults).
        let config = match self.head_of(i) {
            Head::Ferry => ferry,
            Head::Sglang => ferry.under_sglang(SGLANG_HEAD),
        };
        let limits = Limits {
            requests: 48,
            nested_per_request: 512,
            tombstones: 256,
            members: 0,
            prealloc_per_member: 0,
        };
        let inst = harness::instance(Instant(now), &who, &config, &limits);
        (inst, session)
    }

    /// The head instance `i` serves under.
    fn head_of(&self, i: usize) -> Head {
        match self.forwarding {
            Forwarding::SglangDenoisers if i / PER_ROLE == 1 => Head::Sglang,
            _ => Head::Ferry,
        }
    }
}

impl Sim {
    /// The end of the run: every request ended (at the coordinator, once,
    /// or at its sender), nothing in flight, nothing leaked, capacity all
    /// back.
    fn finish(self) -> Outcome {
        let Sim {
            seed,
            trace,
            setup,
            world,
            ledger,
            ..
        } = self;
        let forwarding = setup.forwarding;
        let coord = &world.coord;
        // The coordinator answers only endpoints it was sent from.
        assert_eq!(world.unaddressed, 0, "seed {seed}");
        let Ledger {
            mut out,
            expected,
            ended_at_sender,
            ended_at_coord,
            staged_count,
            ..
        } = ledger;
        out.staged = staged_count;

        if trace {
            for (id, leg) in expected.keys().filter(|k| !ended_at_coord.contains(*k)) {
                println!("not ended at the coordinator: {id} (leg {leg})");
            }
        }
        // Every request ended: at the coordinator (once), or at its sender.
        assert_eq!(coord.stats().events_dropped, 0);
        // Owned tables are sized never to fill: nothing the coordinator
        // meant to send was dropped.
        assert_eq!(coord.stats().transmits_dropped, 0);
        for key @ (id, leg) in expected.keys() {
            assert!(
                ended_at_coord.contains(key) || ended_at_sender.contains(key),
                "seed {seed}: request {id} (leg {leg}) never ended ({forwarding:?})"
            );
        }
        // Drained: nothing in flight, nothing leaked, capacity all back.
        harness::assert_coordinator_drained(coord, &format!("seed {seed}"));
        for (i, inst) in world.insts.iter().enumerate() {
            if !world.up[i] {
                continue;
            }
            out.never_landed += inst.stats().never_landed;
            harness::assert_instance_drained(
                inst,
                PREALLOC.count as u64,
                &format!("seed {seed}: instance {i}"),
            );
        }
        out
    }
}

fn pool_ptr(i: usize, inc: u32) -> u64 {
    0x10_0000_0000 * (i as u64 + 1) + u64::from(inc) * 0x1_0000_0000
}
