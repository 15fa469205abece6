//! A peer that knows the hash key and floods the coordinator with request
//! ids chosen to collide: every message still costs bounded work, and the
//! legitimate traffic after the flood still flows.
//!
//! The machines' keys are random in a deployment (a peer cannot aim at a
//! bucket); this test hands the attacker the key, to check the second
//! line of defence, the bounded probe sequences.

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;

use super::index::{Index, MAX_PROBE};
use super::HashKey;
use crate::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, FailReason, Policy,
    Timeouts,
};
use crate::handshake::instance::{
    Head, Instance, InstanceConfig, InstanceEvent, InstanceIdentity, InstanceStorage, Prealloc,
};
use crate::handshake::{Instant, Limits, PeerId};
use crate::json::RawJson;
use crate::slots::BuddyConfig;
use crate::wire::{decode, Manifest};

const POOL: BuddyConfig = BuddyConfig {
    pool_size: 1 << 20,
    min_block: 4096,
    pool_id: 0,
};
const LIMITS: Limits = Limits {
    requests: 64,
    nested_per_request: 256,
    tombstones: 256,
    members: 4,
    prealloc_per_member: 4,
};
const KEY: HashKey = HashKey::new(7, 11);

/// Request ids whose hashes share their home in every index of a table of
/// `LIMITS` (the low bits of the tombstone index, the largest): what a
/// peer that knew the key would send.
fn colliding_ids(n: usize) -> Vec<String> {
    let places = Index::places_for(LIMITS.tombstones.max(LIMITS.requests));
    let mask = (places - 1) as u64;
    // The transfer table hashes ids in namespace 0, as does the tombstone
    // ring of the encoder's leg (role 0).
    let home = |id: &str| (KEY.bytes(id.as_bytes(), 0) >> 32) & mask;
    let target = home("flood-0");
    (0..)
        .map(|k| format!("flood-{k}"))
        .filter(|id| home(id) == target)
        .take(n)
        .collect()
}

struct World {
    coord: Coordinator<'static>,
    insts: [Instance<'static>; 2],
    buf: Vec<u8>,
    failed: Vec<FailReason>,
    delivered: usize,
}

impl World {
    fn new() -> Self {
        let timeout = Duration::from_secs(60);
        let config = CoordinatorConfig {
            policy: Policy::MostFreeSlots,
            capacity_per_instance: 1,
            timeouts: Timeouts {
                queued: timeout,
                alloc: timeout,
                push: timeout,
                done: timeout,
            },
            retry_backoff: Duration::from_millis(1),
            max_attempts: 3,
            quarantine: timeout,
            message_delay: timeout,
            max_write_lifetime: CoordinatorConfig::FERRY.max_write_lifetime,
            late_done_wait: timeout,
        };
        let mut storage = CoordinatorStorage::owned(&LIMITS);
        storage.hash_key = KEY;
        let coord = Coordinator::new(&["encoder", "denoiser"], config, storage).unwrap();
        // The attacker is the encoder: its own tables are keyed apart.
        let instance = |role, name, key| {
            let who = InstanceIdentity {
                role,
                session_id: name,
                work_endpoint: name,
                coordinator: "tcp://coordinator",
                pool_ptr: 0x10_0000,
                pool_size: POOL.pool_size,
                delivery_complete: true,
                write_lifetime: core::time::Duration::ZERO,
            };
            let config = InstanceConfig {
                min_block: POOL.min_block,
                prealloc: Prealloc::NONE,
                register_retry: timeout,
                staged_timeout: timeout,
                reserved_timeout: timeout,
                quarantine: timeout,
                message_delay: timeout,
                landing_timeout: timeout,
                head: Head::Ferry,
                alloc_hold: timeout,
            };
            let mut storage = InstanceStorage::owned(&LIMITS, &POOL, 0).unwrap();
            storage.hash_key = key;
            Instance::new(Instant(0), &who, &config, storage).unwrap()
        };
        let mut w = Self {
            coord,
            insts: [
                instance("encoder", "enc", HashKey::new(1, 2)),
                instance("denoiser", "den", HashKey::new(3, 4)),
            ],
            buf: vec![0; 16 * 1024],
            failed: Vec::new(),
            delivered: 0,
        };
        w.pump(None);
        assert_eq!(w.coord.members(), 2);
        w
    }

    /// Moves messages until none is left; the most index places the
    /// coordinator read for one message, if `most` asks.
    fn pump(&mut self, mut most: Option<&mut u64>) {
        let now = Instant(0);
        loop {
            let mut moved = false;
            while let Some(Ok(t)) = self.coord.poll_transmit(&mut self.buf) {
                moved = true;
                let msg = decode(&self.buf[..t.len]).unwrap();
                let _ = self.insts[t.to.0 as usize - 1].handle(now, &msg);
            }
            while let Some(e) = self.coord.poll_event() {
                match e {
                    CoordinatorEvent::Failed { reason, .. } => self.failed.push(reason),
                    CoordinatorEvent::Delivered { .. } => self.delivered += 1,
                    _ => {}
                }
            }
            for (i, inst) in self.insts.iter_mut().enumerate() {
                while let Some(Ok(n)) = inst.poll_transmit(&mut self.buf) {
                    moved = true;
                    let msg = decode(&self.buf[..n]).unwrap();
                    let before = self.coord.probes();
                    let _ = self.coord.handle(now, PeerId(i as u32 + 1), &msg);
                    if let Some(m) = most.as_deref_mut() {
                        *m = (*m).max(self.coord.probes() - before);
                    }
                }
                while let Some(w) = inst.poll_action() {
                    moved = true;
                    inst.handle_completion(now, w.token, Ok(())).unwrap();
                }
                while let Some(e) = inst.poll_event() {
                    if let InstanceEvent::Received(t) = e {
                        moved = true;
                        inst.release(t, None).unwrap();
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Stages and commits `id` at the encoder; false if the encoder refused.
    fn send(&mut self, id: &str) -> bool {
        let Ok((token, _)) = self.insts[0].stage(id, 4096) else {
            return false;
        };
        self.insts[0]
            .commit(
                Instant(0),
                token,
                4096,
                &Manifest::Raw(RawJson::EMPTY_OBJECT),
                RawJson::EMPTY_OBJECT,
            )
            .unwrap();
        true
    }
}

#[test]
fn ids_chosen_to_collide_cost_bounded_work_per_message() {
    let mut w = World::new();
    let ids = colliding_ids(3 * MAX_PROBE);
    // Staged all at once: each stays live (the denoiser has room for one
    // transfer), so every id crowds the same probe sequence.
    let mut staged = 0;
    for id in &ids {
        staged += usize::from(w.send(id));
    }
    let mut most = 0;
    w.pump(Some(&mut most));
    // What one message may cost: a handful of lookups, each bounded by the
    // probe sequence, and a removal's bounded walk. A scan of the tables
    // would read hundreds.
    let bound = 8 * MAX_PROBE as u64 + 4 * MAX_PROBE as u64;
    assert!(most <= bound, "a message read {most} index places");
    // What the index could not place was refused as a full table, at once
    // and on the wire; nothing else failed.
    assert!(staged > MAX_PROBE, "the encoder staged {staged}");
    assert!(w.coord.in_flight() <= MAX_PROBE);
    assert!(
        w.failed.iter().all(|r| *r == FailReason::TableFull),
        "{:?}",
        w.failed
    );
    assert!(!w.failed.is_empty());
    // The flood drains, and ordinary ids go through behind it.
    let before = w.delivered;
    for k in 0..200 {
        assert!(w.send(&format!("legit-{k}")));
        w.pump(Some(&mut most));
    }
    assert!(most <= bound, "a message read {most} index places");
    assert_eq!(w.delivered - before, 200);
    assert_eq!(w.coord.in_flight(), 0);
}
