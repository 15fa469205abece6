//! The path tests' world: a coordinator and real instances built from the
//! tests' configurations through the shared harness, joined by a lossless,
//! in-order control plane that the world pumps synchronously (and that a
//! test can tell to drop messages, or to leave writes pending), with every
//! message and event kept for the tests to look at.

use std::time::Duration;

use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant, Limits, PeerId};
use tensorferry_core::json::RawJson;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::wire::{decode, MsgType};

use crate::harness;

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

pub fn instance(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
) -> Instance<'static> {
    instance_with(role, session, endpoint, POOL, None)
}

pub fn instance_with(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
    pool: BuddyConfig,
    landing: Option<Duration>,
) -> Instance<'static> {
    instance_under(Head::Ferry, role, session, endpoint, pool, landing)
}

/// An instance serving under `head` (an ALLOC without room is held 50 ms
/// under sglang's).
pub fn instance_under(
    head: Head,
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
    pool: BuddyConfig,
    landing: Option<Duration>,
) -> Instance<'static> {
    instance_writing(head, role, session, endpoint, pool, landing, Duration::ZERO)
}

/// An instance whose data plane's writes may land up to `write_lifetime`
/// after they are posted (its quarantine covers them).
pub fn instance_writing(
    head: Head,
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
    pool: BuddyConfig,
    landing: Option<Duration>,
    write_lifetime: Duration,
) -> Instance<'static> {
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
        prealloc: Prealloc {
            count: 2,
            size: 8 * KIB,
        },
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

/// A coordinator and instances (instance `i` is peer `i + 1`), joined by a
/// lossless in-order control plane that can be told to drop messages.
pub struct World<'s> {
    pub now: Instant,
    pub coord: Coordinator<'s>,
    pub insts: Vec<Instance<'s>>,
    /// Drop messages of this type, either way.
    pub drop: Vec<MsgType>,
    /// Complete writes at once (with this result), or leave them pending.
    pub writes: Option<Result<(), &'static str>>,
    pub pending: Vec<(usize, Write)>,
    /// Every message that went over the wire: (to coordinator?, type).
    pub log: Vec<(bool, MsgType)>,
    /// The text of every message the instances sent.
    pub from_instances: Vec<String>,
    /// The text of every message the coordinator sent.
    pub from_coordinator: Vec<String>,
    pub coord_events: Vec<CoordinatorEvent>,
    pub inst_events: Vec<(usize, InstanceEvent)>,
    pub ignored: Vec<Ignored>,
    /// Messages to the coordinator whose sender its content named.
    pub judged: u64,
}

impl<'s> World<'s> {
    pub fn new(coord: Coordinator<'s>, insts: Vec<Instance<'s>>) -> Self {
        let mut w = World {
            now: Instant(0),
            coord,
            insts,
            drop: Vec::new(),
            writes: Some(Ok(())),
            pending: Vec::new(),
            log: Vec::new(),
            from_instances: Vec::new(),
            from_coordinator: Vec::new(),
            coord_events: Vec::new(),
            inst_events: Vec::new(),
            ignored: Vec::new(),
            judged: 0,
        };
        w.pump();
        w
    }

    pub fn pump(&mut self) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let mut moved = false;
            for (to, bytes) in harness::coordinator_outbox(&mut self.coord, &mut buf) {
                moved = true;
                let msg = decode(&bytes).unwrap();
                self.log.push((false, msg.msg_type()));
                self.from_coordinator
                    .push(String::from_utf8(bytes.clone()).unwrap());
                if self.drop.contains(&msg.msg_type()) {
                    continue;
                }
                // Where the coordinator named the peer, by the endpoint it
                // named it by; a peer a test named itself, by its number.
                let to = match self.coord.endpoint_of(to) {
                    Some(_) => harness::addressee(
                        &self.coord,
                        to,
                        self.insts.iter().map(Instance::work_endpoint),
                    ),
                    None => (to.0 as usize).checked_sub(1),
                };
                if let Some(inst) = to.and_then(|to| self.insts.get_mut(to)) {
                    match harness::deliver_to_instance(inst, self.now, &bytes) {
                        Ok(()) => {}
                        Err(InstanceUnhandled::Ignored(e)) => self.ignored.push(e),
                        Err(e) => panic!("{msg:?}: {e}"),
                    }
                }
            }
            self.coord_events
                .extend(harness::coordinator_events(&mut self.coord));
            for i in 0..self.insts.len() {
                for bytes in harness::instance_outbox(&mut self.insts[i], &mut buf) {
                    moved = true;
                    let msg = decode(&bytes).unwrap();
                    self.log.push((true, msg.msg_type()));
                    self.from_instances
                        .push(String::from_utf8(bytes.clone()).unwrap());
                    if self.drop.contains(&msg.msg_type()) {
                        continue;
                    }
                    // Judged by content alone, the sender is the one that
                    // sent it (or unknown): what a ZeroMQ coordinator relies on.
                    let role = self.coord.role_of(PeerId(i as u32 + 1));
                    let judged = self.coord.sender_of(&msg, role);
                    if let Some(p) = judged {
                        assert_eq!(p, PeerId(i as u32 + 1), "{msg:?}");
                    }
                    self.judged += u64::from(judged.is_some());
                    // As a channel that names senders delivers it: the
                    // coordinator names the peer by its endpoint.
                    let from = self.insts[i].work_endpoint();
                    let via = "tcp://coordinator:1";
                    match harness::deliver(&mut self.coord, self.now, from, via, &bytes) {
                        Ok(p) => assert_eq!(p, PeerId(i as u32 + 1), "{msg:?}"),
                        Err(Unhandled::Ignored { peer, why }) => {
                            assert_eq!(peer, PeerId(i as u32 + 1), "{msg:?}");
                            self.ignored.push(why);
                        }
                        Err(e) => panic!("{msg:?}: {e}"),
                    }
                }
                while let Some(w) = self.insts[i].poll_action() {
                    moved = true;
                    match self.writes {
                        Some(r) => {
                            let len = self.insts[i]
                                .handle_completion(self.now, w.token, r)
                                .unwrap();
                            assert_eq!(len, w.len);
                        }
                        None => self.pending.push((i, w)),
                    }
                }
                let events = harness::instance_events(&mut self.insts[i]);
                self.inst_events.extend(events.into_iter().map(|e| (i, e)));
            }
            if !moved {
                return;
            }
        }
    }

    /// Moves the clock to `t` ms, firing every timer on the way.
    pub fn advance(&mut self, ms: u64) {
        let end = Instant(self.now.0 + ms * MS);
        for _ in 0..100_000 {
            let next = self
                .insts
                .iter()
                .filter_map(Instance::poll_timeout)
                .chain(self.coord.poll_timeout())
                .filter(|t| *t <= end)
                .min();
            let Some(t) = next else {
                self.now = end;
                return;
            };
            self.now = t.max(self.now);
            self.coord.handle_timeout(self.now);
            for inst in &mut self.insts {
                inst.handle_timeout(self.now);
            }
            self.pump();
        }
        panic!(
            "timers do not settle: coordinator {:?}, instances {:?}",
            self.coord.poll_timeout(),
            self.insts
                .iter()
                .map(Instance::poll_timeout)
                .collect::<Vec<_>>()
        );
    }

    pub fn stage(&mut self, i: usize, id: &str, size: u64) -> Token {
        let (token, _) = self.insts[i].stage(id, size).unwrap();
        let scalars = RawJson::parse_object(r#"{"prompt":"a cat"}"#).unwrap();
        harness::commit_blob(&mut self.insts[i], self.now, token, size, scalars, None).unwrap();
        self.pump();
        token
    }

    pub fn sent(&self, ty: MsgType) -> usize {
        self.log.iter().filter(|(_, t)| *t == ty).count()
    }

    pub fn received(&self, i: usize) -> Vec<Token> {
        self.inst_events
            .iter()
            .filter_map(|(j, e)| match e {
                InstanceEvent::Received(t) if *j == i => Some(*t),
                _ => None,
            })
            .collect()
    }

    pub fn failed(&self) -> Vec<FailReason> {
        self.coord_events
            .iter()
            .filter_map(|e| match e {
                CoordinatorEvent::Failed { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    pub fn delivered(&self) -> usize {
        self.coord_events
            .iter()
            .filter(|e| matches!(e, CoordinatorEvent::Delivered { .. }))
            .count()
    }

    /// Nothing held anywhere: only the preallocated slots are allocated.
    pub fn assert_clean(&self) {
        harness::assert_coordinator_drained(&self.coord, "coordinator");
        for (i, inst) in self.insts.iter().enumerate() {
            harness::assert_instance_drained(inst, 2, &format!("instance {i}"));
        }
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
