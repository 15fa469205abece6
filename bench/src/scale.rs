//! Control-plane hand-offs per second as a deployment grows: E encoders
//! and D denoisers under one coordinator, each denoiser holding its last H
//! deliveries before it releases the oldest, so that about D×H transfers
//! stay live at the coordinator (`ferry bench scale`). Every machine runs
//! in this process on one thread, every message is encoded and decoded,
//! writes complete at once and no data moves: what is left is the state
//! machines' own work per hand-off, which should not grow with the tables.

use std::collections::VecDeque;
use std::time::{Duration, Instant as Clock};

use tensorferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, Policy, Timeouts,
};
use tensorferry_core::handshake::instance::{
    Head, Instance, InstanceConfig, InstanceEvent, InstanceIdentity, InstanceStorage, Prealloc,
    Token,
};
use tensorferry_core::handshake::{Instant, Limits, PeerId};
use tensorferry_core::json::RawJson;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::wire::{decode, Manifest, TensorEntry};

/// Preallocated slots the coordinator takes from each instance (the
/// runtime's default limit).
const P: usize = Limits::COORDINATOR.prealloc_per_member;

const POOL: BuddyConfig = BuddyConfig {
    pool_size: 1 << 30,
    min_block: 1 << 20,
    pool_id: 0,
};
const PIPELINE: [&str; 2] = ["encoder", "denoiser"];
const TIMEOUT: Duration = Duration::from_secs(3600);
/// The bytes each hand-off announces: the latents of the pipeline example.
const DIMS: [u64; 5] = [1, 16, 21, 90, 160];
const SIZE: u64 = 2 * 16 * 21 * 90 * 160;

/// One deployment's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deployment {
    /// Encoders (senders).
    pub encoders: usize,
    /// Denoisers (receivers).
    pub denoisers: usize,
    /// Deliveries each denoiser holds before releasing the oldest.
    pub held: usize,
}

impl Deployment {
    /// Transfers live at the coordinator while the denoisers hold theirs.
    pub fn live(&self) -> usize {
        self.denoisers * self.held
    }

    /// Instances registered.
    pub fn instances(&self) -> usize {
        self.encoders + self.denoisers
    }
}

/// The rows of `ferry bench scale`: the issue's table, then 1,024
/// instances with 16,000 transfers live.
pub const ROWS: [Deployment; 8] = [
    Deployment {
        encoders: 1,
        denoisers: 1,
        held: 0,
    },
    Deployment {
        encoders: 1,
        denoisers: 1,
        held: 8,
    },
    Deployment {
        encoders: 4,
        denoisers: 4,
        held: 16,
    },
    Deployment {
        encoders: 8,
        denoisers: 32,
        held: 16,
    },
    Deployment {
        encoders: 16,
        denoisers: 64,
        held: 32,
    },
    Deployment {
        encoders: 32,
        denoisers: 128,
        held: 32,
    },
    Deployment {
        encoders: 64,
        denoisers: 256,
        held: 16,
    },
    Deployment {
        encoders: 24,
        denoisers: 1000,
        held: 16,
    },
];

/// One measurement.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// The deployment.
    pub shape: Deployment,
    /// Through preallocated slots where the denoisers have them free.
    pub fast_path: bool,
    /// Hand-offs per second.
    pub per_second: f64,
    /// Index places read per hand-off, over every machine.
    pub probes_per_handoff: f64,
}

/// An instance's tables: its requests in flight (the held deliveries and a
/// window), and a small tombstone ring, so that a thousand of them fit in
/// one process; the coordinator's are [`Limits::default`].
fn instance_limits(held: usize) -> Limits {
    Limits {
        requests: held + 16,
        nested_per_request: 1024,
        tombstones: 1024,
        members: 1,
        prealloc_per_member: 0,
    }
}

fn instance(
    role: &str,
    name: &str,
    held: usize,
    prealloc: usize,
) -> Result<Instance<'static>, String> {
    let who = InstanceIdentity {
        role,
        session_id: name,
        work_endpoint: name,
        coordinator: "tcp://coordinator",
        pool_ptr: 0x7f00_0000_0000,
        pool_size: POOL.pool_size,
        delivery_complete: true,
        write_lifetime: Duration::ZERO,
    };
    let config = InstanceConfig {
        min_block: POOL.min_block,
        prealloc: Prealloc {
            count: prealloc,
            size: 16 << 20,
        },
        register_retry: TIMEOUT,
        staged_timeout: TIMEOUT,
        reserved_timeout: TIMEOUT,
        quarantine: TIMEOUT,
        message_delay: Duration::ZERO,
        landing_timeout: TIMEOUT,
        head: Head::Ferry,
        alloc_hold: TIMEOUT,
    };
    let storage = InstanceStorage::owned(&instance_limits(held), &POOL, prealloc)
        .map_err(|e| format!("instance storage: {e}"))?;
    Instance::new(Instant(0), &who, &config, storage).map_err(|e| format!("instance {name}: {e}"))
}

/// The machines of one deployment and the messages between them.
struct World {
    coord: Coordinator<'static>,
    /// Encoders first, then denoisers; peer `i + 1` is `insts[i]`.
    insts: Vec<Instance<'static>>,
    /// Per denoiser, the deliveries it holds, oldest first.
    holding: Vec<VecDeque<Token>>,
    held: usize,
    /// Instances with something to poll, and whether each is listed.
    ready: VecDeque<usize>,
    listed: Vec<bool>,
    buf: Vec<u8>,
    delivered: u64,
}

impl World {
    fn new(shape: Deployment, fast_path: bool) -> Result<Self, String> {
        let config = CoordinatorConfig {
            policy: Policy::MostFreeSlots,
            // Room for what a denoiser holds, and a few more on the way.
            capacity_per_instance: shape.held as u32 + 4,
            timeouts: Timeouts {
                queued: TIMEOUT,
                alloc: TIMEOUT,
                push: TIMEOUT,
                done: TIMEOUT,
            },
            retry_backoff: Duration::from_millis(1),
            max_attempts: 3,
            quarantine: TIMEOUT,
            message_delay: Duration::ZERO,
            max_write_lifetime: CoordinatorConfig::FERRY.max_write_lifetime,
            late_done_wait: TIMEOUT,
        };
        let limits = Limits::default();
        limits.check().map_err(|e| e.to_string())?;
        let coord = Coordinator::new(&PIPELINE, config, CoordinatorStorage::owned(&limits))
            .map_err(|e| format!("coordinator: {e}"))?;
        let prealloc = if fast_path {
            (shape.held + 1).min(P)
        } else {
            0
        };
        let mut insts = Vec::with_capacity(shape.instances());
        for e in 0..shape.encoders {
            insts.push(instance("encoder", &format!("enc-{e}"), 0, 0)?);
        }
        for d in 0..shape.denoisers {
            insts.push(instance(
                "denoiser",
                &format!("den-{d}"),
                shape.held,
                prealloc,
            )?);
        }
        let n = insts.len();
        let mut w = Self {
            coord,
            insts,
            holding: vec![VecDeque::new(); n],
            held: shape.held,
            ready: (0..n).collect(),
            listed: vec![true; n],
            buf: vec![0u8; 64 * 1024],
            delivered: 0,
        };
        w.pump();
        if w.coord.members() != n {
            return Err(format!("{} of {n} instances registered", w.coord.members()));
        }
        Ok(w)
    }

    fn list(&mut self, i: usize) {
        if !self.listed[i] {
            self.listed[i] = true;
            self.ready.push_back(i);
        }
    }

    /// Moves every message until nothing is left to move.
    fn pump(&mut self) {
        let now = Instant(0);
        loop {
            while let Some(Ok(t)) = self.coord.poll_transmit(&mut self.buf) {
                let i = t.to.0 as usize - 1;
                if let (Ok(msg), Some(inst)) = (decode(&self.buf[..t.len]), self.insts.get_mut(i)) {
                    let _ = inst.handle(now, &msg);
                }
                self.list(i);
            }
            while let Some(e) = self.coord.poll_event() {
                self.delivered += u64::from(matches!(e, CoordinatorEvent::Delivered { .. }));
            }
            let Some(i) = self.ready.pop_front() else {
                return;
            };
            self.listed[i] = false;
            let inst = &mut self.insts[i];
            while let Some(Ok(n)) = inst.poll_transmit(&mut self.buf) {
                if let Ok(msg) = decode(&self.buf[..n]) {
                    let _ = self.coord.handle(now, PeerId(i as u32 + 1), &msg);
                }
            }
            // A completion or a release queues a message: poll it again.
            let mut again = false;
            while let Some(w) = inst.poll_action() {
                let _ = inst.handle_completion(now, w.token, Ok(()));
                again = true;
            }
            while let Some(e) = inst.poll_event() {
                if let InstanceEvent::Received(t) = e {
                    let holding = &mut self.holding[i];
                    holding.push_back(t);
                    while holding.len() > self.held {
                        if let Some(old) = holding.pop_front() {
                            let _ = inst.release(old, None);
                            again = true;
                        }
                    }
                }
            }
            if again {
                self.list(i);
            }
        }
    }

    fn probes(&self) -> u64 {
        self.coord.probes() + self.insts.iter().map(Instance::probes).sum::<u64>()
    }
}

/// Runs one row for about `duration` after a warm-up that fills the
/// denoisers' holds: hand-offs per second.
pub fn measure(shape: Deployment, fast_path: bool, duration: Duration) -> Result<Rate, String> {
    let mut w = World::new(shape, fast_path)?;
    let dims = DIMS;
    let tensors = [TensorEntry::single("latents", &dims, "bfloat16")];
    let manifest = Manifest::Entries(&tensors);
    let scalars = RawJson::parse_object(r#"{"prompt":"a red fox","steps":50}"#)
        .map_err(|e| format!("scalar fields: {e}"))?;
    let mut n = 0u64;
    let handoff = |w: &mut World, n: &mut u64| -> Result<(), String> {
        let e = (*n % shape.encoders as u64) as usize;
        let id = format!("req-{n}");
        *n += 1;
        let (token, _) = w.insts[e]
            .stage(&id, SIZE)
            .map_err(|err| format!("encoder {e} stage {id}: {err}"))?;
        w.insts[e]
            .commit(Instant(0), token, SIZE, &manifest, scalars)
            .map_err(|err| format!("encoder {e} commit {id}: {err}"))?;
        w.list(e);
        w.pump();
        Ok(())
    };
    // Warm-up: every denoiser's hold filled, so the live count is reached.
    for _ in 0..shape.live() + 256 {
        handoff(&mut w, &mut n)?;
    }
    let live = w.coord.in_flight();
    if live + 4 < shape.live() {
        return Err(format!(
            "only {live} transfers live at the coordinator, {} expected",
            shape.live()
        ));
    }
    let (delivered, probes) = (w.delivered, w.probes());
    let start = Clock::now();
    while start.elapsed() < duration {
        for _ in 0..256 {
            handoff(&mut w, &mut n)?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let done = (w.delivered - delivered) as f64;
    Ok(Rate {
        shape,
        fast_path,
        per_second: done / secs,
        probes_per_handoff: (w.probes() - probes) as f64 / done.max(1.0),
    })
}
