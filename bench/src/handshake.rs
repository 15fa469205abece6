//! Control-plane hand-offs per second: a coordinator, an encoder and a
//! denoiser in one process, every message encoded and decoded, writes
//! completed at once (no data moves): `ferry bench handshake`.

use std::time::{Duration, Instant as Clock};

use ferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, Policy, Timeouts,
};
use ferry_core::handshake::instance::{Instance, InstanceConfig, InstanceEvent, InstanceStorage};
use ferry_core::handshake::{Instant, Limits, PeerId};
use ferry_core::json::RawJson;
use ferry_core::slots::BuddyConfig;
use ferry_core::wire::{decode, Manifest, Shape, TensorEntry};

/// The runtime's coordinator keeps this many preallocated slots per
/// instance; so does this one.
const P: usize = ferry::runtime::PREALLOC_PER_INSTANCE;

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

fn instance(role: &str, session: &str, fast_path: bool) -> Instance<'static> {
    let config = InstanceConfig {
        role,
        session_id: session,
        work_endpoint: session,
        pool_ptr: 0x7f00_0000_0000,
        pool: POOL,
        prealloc: (if fast_path { 4 } else { 0 }, 64 << 20),
        register_retry: TIMEOUT,
        staged_timeout: TIMEOUT,
        reserved_timeout: TIMEOUT,
        quarantine: TIMEOUT,
        landing: None,
        head: ferry_core::handshake::instance::Head::Ferry,
        alloc_hold: Duration::from_secs(20),
    };
    // Valid by construction: fixed sizes that fit.
    let storage = match InstanceStorage::owned(&LIMITS, &POOL, config.prealloc.0) {
        Ok(s) => s,
        Err(e) => panic!("benchmark instance storage: {e}"),
    };
    match Instance::new(Instant(0), config, storage) {
        Ok(i) => i,
        Err(e) => panic!("benchmark instance: {e}"),
    }
}

/// Runs hand-offs for about `duration`: the preallocated-slot fast path,
/// or the slow path through `transfer_alloc`. Returns hand-offs per second.
pub fn measure(duration: Duration, fast_path: bool) -> f64 {
    let config = CoordinatorConfig {
        pipeline: &PIPELINE,
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
    let mut coord = match Coordinator::<P>::new(config, CoordinatorStorage::owned(&LIMITS)) {
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

    let mut pump =
        |coord: &mut Coordinator<'static, P>, insts: &mut [Instance<'static>; 2]| -> u64 {
            let mut delivered = 0;
            loop {
                let mut moved = false;
                while let Some(Ok(t)) = coord.poll_transmit(&mut buf) {
                    moved = true;
                    if let (Ok(msg), Some(inst)) =
                        (decode(&buf[..t.len]), insts.get_mut(t.to.0 as usize - 1))
                    {
                        let _ = inst.handle(now, &msg);
                    }
                }
                while let Some(e) = coord.poll_event() {
                    delivered += u64::from(matches!(e, CoordinatorEvent::Delivered { .. }));
                }
                for (i, inst) in insts.iter_mut().enumerate() {
                    while let Some(Ok(n)) = inst.poll_transmit(&mut buf) {
                        moved = true;
                        if let Ok(msg) = decode(&buf[..n]) {
                            let _ = coord.handle(now, PeerId(i as u32 + 1), &msg);
                        }
                    }
                    while let Some(w) = inst.poll_action() {
                        moved = true;
                        let _ = inst.handle_completion(now, w.token, Ok(()));
                    }
                    while let Some(e) = inst.poll_event() {
                        if let InstanceEvent::Received(t) = e {
                            moved = true;
                            let _ = inst.release(t, None);
                        }
                    }
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
            if let Ok((token, _)) = insts[0].stage(&id, size) {
                let _ = insts[0].commit(now, token, size, &manifest, scalars);
            }
            delivered += pump(&mut coord, &mut insts);
        }
    }
    delivered as f64 / start.elapsed().as_secs_f64()
}
