//! The path tests' machines, built from the tests' configurations, in the
//! harness's [`World`] over its lossless wire (what the simulation and the
//! fuzz target drive too, over their wires).

use std::time::Duration;

use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Instant, Limits};
use tensorferry_core::json::RawJson;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::wire::MsgType;

use crate::harness::{self, Lossless};

pub const KIB: u64 = 1024;
pub const MS: u64 = 1_000_000;
pub const PIPELINE: [&str; 2] = ["encoder", "denoiser"];

/// Where the instances' pools are, in their own address space.
pub const POOL_PTR: u64 = 0x7f00_0000_0000;

pub const POOL: BuddyConfig = BuddyConfig {
    pool_size: 64 * KIB,
    min_block: 4 * KIB,
    pool_id: 0,
};

/// The instances' table sizes (their queues are sized from them).
pub const LIMITS: Limits = Limits {
    requests: 8,
    nested_per_request: 512,
    tombstones: 16,
    members: 4,
    prealloc_per_member: 4,
};

pub const TIMEOUTS: Timeouts = Timeouts {
    queued: Duration::from_millis(100),
    alloc: Duration::from_millis(10),
    push: Duration::from_millis(10),
    done: Duration::from_millis(10),
};

/// A coordinator with room for `transfers` transfers.
pub fn coordinator(transfers: usize) -> Coordinator<'static> {
    coordinator_for(transfers, &PIPELINE)
}

/// The path tests' coordinator configuration: round robin, two transfers
/// an instance, short timeouts.
pub const COORDINATOR: CoordinatorConfig = CoordinatorConfig {
    policy: Policy::RoundRobin,
    capacity_per_instance: 2,
    timeouts: TIMEOUTS,
    retry_backoff: Duration::from_millis(1),
    max_attempts: 3,
    quarantine: Duration::from_millis(5),
    message_delay: Duration::ZERO,
    max_write_lifetime: CoordinatorConfig::FERRY.max_write_lifetime,
    late_done_wait: Duration::from_millis(50),
};

pub fn coordinator_for(transfers: usize, pipeline: &[&str]) -> Coordinator<'static> {
    let config = COORDINATOR;
    let limits = Limits {
        requests: transfers,
        tombstones: 64,
        ..LIMITS
    };
    harness::coordinator(pipeline, config, &limits)
}

/// How a path test's instance serves: under which head, with which
/// preallocated slots, from which pool,
/// whether its data plane reports landings (and then how long a transfer
/// waits for one), and how long after they are posted its writes may land.
pub struct Serving {
    pub head: Head,
    pub prealloc: Prealloc,
    pub pool: BuddyConfig,
    pub landing: Option<Duration>,
    pub write_lifetime: Duration,
}

impl Serving {
    /// ferry's head, two preallocated slots of 8 KiB, [`POOL`], completions
    /// that mean delivery, writes that land before they complete.
    pub const FERRY: Serving = Serving {
        head: Head::Ferry,
        prealloc: Prealloc {
            count: 2,
            size: 8 * KIB,
        },
        pool: POOL,
        landing: None,
        write_lifetime: Duration::ZERO,
    };
}

pub fn instance(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
) -> Instance<'static> {
    instance_serving(role, session, endpoint, Serving::FERRY)
}

/// An instance serving as `how` says (an ALLOC without room is held 50 ms
/// under sglang's head; its quarantine covers its writes' lifetime).
pub fn instance_serving(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
    how: Serving,
) -> Instance<'static> {
    let Serving {
        head,
        prealloc,
        pool,
        landing,
        write_lifetime,
    } = how;
    let who = InstanceIdentity {
        role,
        session_id: session,
        work_endpoint: endpoint,
        coordinator: "tcp://coordinator",
        pool_ptr: POOL_PTR,
        pool_size: pool.pool_size,
        delivery_complete: landing.is_none(),
        write_lifetime,
    };
    let config = InstanceConfig {
        min_block: pool.min_block,
        prealloc,
        register_retry: Duration::from_millis(5),
        staged_timeout: Duration::from_millis(100),
        reserved_timeout: Duration::from_millis(100),
        quarantine: Duration::from_millis(5).max(write_lifetime),
        message_delay: Duration::ZERO,
        landing_timeout: landing.unwrap_or(Duration::from_millis(100)),
        head,
        alloc_hold: Duration::from_millis(50),
    };
    harness::instance(Instant(0), &who, &config, &LIMITS)
}

/// The path tests' world (the harness's): a coordinator and instances
/// (instance `i` is peer `i + 1`), joined by a lossless in-order control
/// plane that a test can tell to drop messages (`w.wire.drop`) or to hold
/// writes (`w.wire.writes`), pumped synchronously, strict, every message
/// and event kept for the tests to look at.
pub type World<'s> = harness::World<'s, Lossless>;

/// What the paths do with their world.
pub trait Walk {
    /// Stages `size` bytes as request `id` at instance `i` and commits
    /// them, then pumps.
    fn stage(&mut self, i: usize, id: &str, size: u64) -> Token;

    /// [`stage`](Walk::stage), with the wire holding writes from now on
    /// (`wire.writes` `None`): the write stays pending for the test to
    /// complete or fail.
    fn stage_held(&mut self, i: usize, id: &str, size: u64) -> Token;

    /// Stages `size` bytes as request `id` at the sender (instance 0): the
    /// receiver's (instance 1's) token for it, the one transfer it holds.
    fn hand_over(&mut self, id: &str, size: u64) -> Token;

    /// Stages `id` (20 KiB: too large for a preallocated slot, so an ALLOC
    /// asks for room) with the receiver's `transfer_allocated` lost, and
    /// lets the ALLOC time out: the request fails.
    fn time_out_alloc(&mut self, id: &str);

    /// Nothing held anywhere: only the preallocated slots are allocated.
    fn assert_clean(&self);

    /// [`assert_clean`](Walk::assert_clean) once `ms` more milliseconds
    /// have passed (quarantines and timeouts over).
    fn assert_clean_after(&mut self, ms: u64);

    /// The receiver (instance 1) consumes the transfer `token`, then pumps.
    fn consume(&mut self, token: Token);

    /// `delivered` transfers were delivered, and nothing is held anywhere.
    fn assert_done(&self, delivered: usize);

    /// Completes every write held (`wire.writes` is `None`) successfully,
    /// then pumps.
    fn complete_writes(&mut self);

    /// Completes the last write held successfully, then pumps: returns
    /// that write.
    fn complete_last(&mut self) -> Write;
}

impl Walk for World<'_> {
    fn stage(&mut self, i: usize, id: &str, size: u64) -> Token {
        let (token, _) = self.insts[i].stage(id, size).unwrap();
        let scalars = RawJson::parse_object(r#"{"prompt":"a cat"}"#).unwrap();
        harness::commit_blob(&mut self.insts[i], self.now, token, size, scalars, None).unwrap();
        self.pump();
        token
    }

    fn stage_held(&mut self, i: usize, id: &str, size: u64) -> Token {
        self.wire.writes = None;
        self.stage(i, id, size)
    }

    #[track_caller]
    fn hand_over(&mut self, id: &str, size: u64) -> Token {
        self.stage(0, id, size);
        let [token] = self.received(1)[..] else {
            panic!("{:?}", self.inst_events)
        };
        token
    }

    #[track_caller]
    fn time_out_alloc(&mut self, id: &str) {
        self.wire.drop = vec![MsgType::Allocated];
        self.stage(0, id, 20 * KIB);
        self.advance(11);
        assert_eq!(self.failed(), vec![FailReason::AllocTimeout]);
    }

    #[track_caller]
    fn assert_clean(&self) {
        self.assert_drained(2, "world");
    }

    #[track_caller]
    fn assert_clean_after(&mut self, ms: u64) {
        self.advance(ms);
        self.assert_clean();
    }

    fn consume(&mut self, token: Token) {
        self.insts[1].release(token, None).unwrap();
        self.pump();
    }

    #[track_caller]
    fn assert_done(&self, delivered: usize) {
        assert_eq!(self.delivered(), delivered);
        self.assert_clean();
    }

    fn complete_writes(&mut self) {
        for (i, write) in std::mem::take(&mut self.pending) {
            self.insts[i]
                .handle_completion(self.now, write.token, Ok(()))
                .unwrap();
        }
        self.pump();
    }

    fn complete_last(&mut self) -> Write {
        let (i, write) = self.pending.pop().unwrap();
        self.insts[i]
            .handle_completion(self.now, write.token, Ok(()))
            .unwrap();
        self.pump();
        write
    }
}

macro_rules! world {
    ($w:ident, $transfers:expr) => {
        let insts = vec![
            instance("encoder", "enc-0", "tcp://enc:1"),
            instance("denoiser", "den-0", "tcp://den:1"),
        ];
        let mut $w = World::new(coordinator($transfers), insts);
        assert!($w.insts.iter().all(Instance::is_registered));
    };
}
