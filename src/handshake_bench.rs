//! Control-plane hand-offs per second: a coordinator, an encoder and a
//! denoiser in one process, every message encoded and decoded, writes
//! completed at once (no data moves). Used by `ferry bench handshake` and
//! `cargo bench --bench handshake`.

use std::time::{Duration, Instant as Clock};

use ferry_core::handshake::coordinator::{CoordinatorConfig, CoordinatorEvent, Policy, Timeouts};
use ferry_core::handshake::instance::{InstanceConfig, InstanceEvent};
use ferry_core::handshake::{Instant, PeerId};
use ferry_core::json::RawJson;
use ferry_core::slots::BuddyConfig;
use ferry_core::wire::{decode, Manifest, Shape, TensorEntry};

use crate::runtime::storage::{
    CoordinatorStore, InstanceStore, Limits, OwnedCoordinator, OwnedInstance,
};

const POOL: BuddyConfig = BuddyConfig {
    pool_size: 1 << 30,
    min_block: 1 << 20,
    pool_id: 0,
};
const PIPELINE: [&str; 2] = ["encoder", "denoiser"];
const TIMEOUT: Duration = Duration::from_secs(60);
const LIMITS: Limits = Limits {
    requests: 64,
    nested_per_request: 1024,
    tombstones: 256,
    members: 4,
};

fn instance(role: &str, session: &str, fast_path: bool) -> OwnedInstance {
    let config = InstanceConfig {
        role: "",
        session_id: "",
        work_endpoint: "",
        pool_ptr: 0x7f00_0000_0000,
        pool: POOL,
        prealloc: (if fast_path { 4 } else { 0 }, 64 << 20),
        register_retry: TIMEOUT,
        staged_timeout: TIMEOUT,
        reserved_timeout: TIMEOUT,
        quarantine: TIMEOUT,
        landing: None,
    };
    let names = [role, session, session].map(str::to_owned);
    // Valid by construction: fixed sizes that fit.
    let store = match InstanceStore::new(names, &LIMITS, &POOL, config.prealloc.0) {
        Ok(s) => s,
        Err(e) => panic!("benchmark instance storage: {e}"),
    };
    match OwnedInstance::create(Instant(0), config, store) {
        Ok(i) => i,
        Err(e) => panic!("benchmark instance: {e}"),
    }
}

/// Runs hand-offs for about `duration`: the preallocated-slot fast path,
/// or the slow path through `transfer_alloc`. Returns hand-offs per second.
pub fn measure(duration: Duration, fast_path: bool) -> f64 {
    let config = CoordinatorConfig {
        pipeline: &[],
        policy: Policy::MostFreeSlots,
        capacity_per_instance: 16,
        timeouts: Timeouts {
            queued: TIMEOUT,
            alloc: TIMEOUT,
            push: TIMEOUT,
            done: TIMEOUT,
        },
        retry_backoff: Duration::from_millis(1),
        max_attempts: 3,
        quarantine: TIMEOUT,
        late_done_wait: TIMEOUT,
    };
    let roles = PIPELINE.map(str::to_owned).to_vec();
    let mut coord = match OwnedCoordinator::create(roles, config, CoordinatorStore::new(&LIMITS)) {
        Ok(c) => c,
        Err(e) => panic!("benchmark coordinator: {e:?}"),
    };
    let mut insts = [
        instance("encoder", "enc", false),
        instance("denoiser", "den", fast_path),
    ];
    let mut buf = vec![0u8; 64 * 1024];
    let now = Instant(0);
    let dims = [1u64, 16, 21, 90, 160];
    let tensors = [TensorEntry {
        field: "latents".into(),
        list_index: None,
        offset: 0,
        shape: Shape::Dims(&dims),
        dtype: "bfloat16".into(),
    }];
    let manifest = Manifest::Entries(&tensors);
    let scalars = RawJson::parse_object(r#"{"prompt":"a red fox","steps":50}"#)
        .unwrap_or(RawJson::EMPTY_OBJECT);
    let size = 2 * 16 * 21 * 90 * 160;

    let mut pump = |coord: &mut OwnedCoordinator, insts: &mut [OwnedInstance; 2]| -> u64 {
        let mut delivered = 0;
        loop {
            let mut moved = false;
            while let Some(Ok(t)) = coord.run(|c| c.poll_transmit(&mut buf)) {
                moved = true;
                if let (Ok(msg), Some(inst)) =
                    (decode(&buf[..t.len]), insts.get_mut(t.to.0 as usize - 1))
                {
                    let _ = inst.run(|i| i.handle(now, &msg));
                }
            }
            while let Some(e) = coord.run(|c| c.poll_event()) {
                delivered += u64::from(matches!(e, CoordinatorEvent::Delivered { .. }));
            }
            for (i, inst) in insts.iter_mut().enumerate() {
                while let Some(Ok(n)) = inst.run(|m| m.poll_transmit(&mut buf)) {
                    moved = true;
                    if let Ok(msg) = decode(&buf[..n]) {
                        let _ = coord.run(|c| c.handle(now, PeerId(i as u32 + 1), &msg));
                    }
                }
                moved |= inst.run(|m| {
                    let mut moved = false;
                    while let Some(w) = m.poll_action() {
                        moved = true;
                        let _ = m.handle_completion(now, w.token, Ok(()));
                    }
                    while let Some(e) = m.poll_event() {
                        if let InstanceEvent::Received(t) = e {
                            moved = true;
                            let _ = m.release(t, None);
                        }
                    }
                    moved
                });
            }
            if !moved {
                return delivered;
            }
        }
    };
    pump(&mut coord, &mut insts);

    let start = Clock::now();
    let (mut n, mut delivered) = (0u64, 0u64);
    while start.elapsed() < duration {
        for _ in 0..256 {
            let id = format!("req-{n}");
            n += 1;
            insts[0].run(|m| {
                if let Ok((token, _)) = m.stage(&id, size) {
                    let _ = m.commit(now, token, size, &manifest, scalars);
                }
            });
            delivered += pump(&mut coord, &mut insts);
        }
    }
    delivered as f64 / start.elapsed().as_secs_f64()
}
