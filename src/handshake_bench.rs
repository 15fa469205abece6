//! Control-plane hand-offs per second: a coordinator, an encoder and a
//! denoiser in one process, every message encoded and decoded, writes
//! completed at once (no data moves). Used by `ferry bench handshake` and
//! `cargo bench --bench handshake`.

use std::time::{Duration, Instant as Clock};

use ferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, Member,
    Outgoing as CoordOut, Parked, Policy, Queued, Timeouts, Transfer,
};
use ferry_core::handshake::instance::{
    Instance, InstanceConfig, InstanceEvent, InstanceStorage, Outgoing as InstOut, Request, Write,
};
use ferry_core::handshake::{Instant, PeerId, Tombstone};
use ferry_core::json::RawJson;
use ferry_core::slots::{Buddy, BuddyConfig};
use ferry_core::wire::{decode, Manifest, PreallocatedSlot, Shape, TensorEntry};

const POOL: BuddyConfig = BuddyConfig {
    pool_size: 1 << 30,
    min_block: 1 << 20,
    pool_id: 0,
};
const PIPELINE: [&str; 2] = ["encoder", "denoiser"];
const TIMEOUT: Duration = Duration::from_secs(60);

/// Owned storage for one instance.
struct InstanceStore {
    tree: Vec<u8>,
    gens: Vec<u32>,
    requests: Vec<Option<Request>>,
    nested: Vec<u8>,
    prealloc: Vec<PreallocatedSlot>,
    prealloc_use: Vec<Option<usize>>,
    transmits: Vec<Option<InstOut>>,
    actions: Vec<Option<Write>>,
    events: Vec<Option<InstanceEvent>>,
    tombstones: Vec<Tombstone>,
}

impl InstanceStore {
    fn new() -> Self {
        let (nodes, gens) = Buddy::storage_needed(&POOL).unwrap_or((0, 0));
        Self {
            tree: vec![0; nodes],
            gens: vec![0; gens],
            requests: (0..64).map(|_| None).collect(),
            nested: vec![0; 64 * 1024],
            prealloc: vec![
                PreallocatedSlot {
                    offset: 0,
                    size: 0,
                    slot_id: 0,
                    addr: 0
                };
                4
            ],
            prealloc_use: vec![None; 4],
            transmits: (0..256).map(|_| None).collect(),
            actions: (0..64).map(|_| None).collect(),
            events: (0..256).map(|_| None).collect(),
            tombstones: vec![Tombstone::EMPTY; 64],
        }
    }

    fn instance(
        &mut self,
        role: &'static str,
        session: &'static str,
        fast_path: bool,
    ) -> Instance<'_> {
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
        };
        let storage = InstanceStorage {
            tree: &mut self.tree,
            generations: &mut self.gens,
            requests: &mut self.requests,
            nested: &mut self.nested,
            prealloc: &mut self.prealloc,
            prealloc_use: &mut self.prealloc_use,
            transmits: &mut self.transmits,
            actions: &mut self.actions,
            events: &mut self.events,
            tombstones: &mut self.tombstones,
        };
        // Valid by construction: fixed sizes that fit.
        match Instance::new(Instant(0), config, storage) {
            Ok(i) => i,
            Err(e) => panic!("benchmark instance: {e}"),
        }
    }
}

/// Runs hand-offs for about `duration`: the preallocated-slot fast path,
/// or the slow path through `transfer_alloc`. Returns hand-offs per second.
pub fn measure(duration: Duration, fast_path: bool) -> f64 {
    let mut members: Vec<Option<Member<4>>> = (0..4).map(|_| None).collect();
    let mut transfers: Vec<Option<Transfer>> = (0..64).map(|_| None).collect();
    let mut nested = vec![0u8; 64 * 1024];
    let mut ctx: Vec<Option<CoordOut>> = (0..256).map(|_| None).collect();
    let mut cev: Vec<Option<CoordinatorEvent>> = (0..256).map(|_| None).collect();
    let mut parked: Vec<Option<Parked>> = (0..16).map(|_| None).collect();
    let mut finished = vec![Tombstone::EMPTY; 256];
    let mut queue: Vec<Option<Queued>> = (0..128).map(|_| None).collect();
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
    let storage = CoordinatorStorage {
        members: &mut members,
        transfers: &mut transfers,
        nested: &mut nested,
        transmits: &mut ctx,
        events: &mut cev,
        parked: &mut parked,
        queue: &mut queue,
        finished: &mut finished,
    };
    let mut coord = match Coordinator::new(config, storage) {
        Ok(c) => c,
        Err(e) => panic!("benchmark coordinator: {e:?}"),
    };
    let (mut s0, mut s1) = (InstanceStore::new(), InstanceStore::new());
    let mut insts = [
        s0.instance("encoder", "enc", false),
        s1.instance("denoiser", "den", fast_path),
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

    let mut pump = |coord: &mut Coordinator<'_, 4>, insts: &mut [Instance<'_>; 2]| -> u64 {
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
