//! The control plane over CurveZMQ against plain ZeroMQ, side by side in
//! one run (`ferry bench --curve`): two rigs of a coordinator, a sender and
//! a receiver in this process, over ZeroMQ on `tcp://127.0.0.1` and the
//! shared-memory data plane, one plain and one with every endpoint a CURVE
//! server. Two figures, each taken in turns on both rigs so that both see
//! the same machine:
//!
//! - the handshake: a new instance started (a small pool), connected and
//!   registered (TCP and, under CURVE, its handshake both ways and the
//!   authentication handler's answer);
//! - a hand-off of each size, from `commit` to the receiver holding it
//!   (every control message encrypted under CURVE; the bytes themselves
//!   move through shared memory either way);
//! - two transfer engines on the local plane, unguarded and guarded (an
//!   allow-list and CURVE on their notification inboxes): a notification's
//!   round trip, and a write of each size with a notification attached,
//!   from the post to the peer holding the notification.
//!
//! The guarded rigs also take the allow-list (127.0.0.1), so the figures
//! are of every guard on against none.

use std::time::{Duration, Instant};

use tensorferry::runtime::{DataPlane, NodeError, Prealloc};
use tensorferry_zmq::{CurveConfig, CurveKeyPair, Guard};

use crate::rig::{Control, Guards, Pools};

/// Sizes measured by default.
pub const SIZES: [u64; 2] = [4 << 10, 64 << 20];

/// New instances started and registered on each rig for the handshake.
const HANDSHAKES: usize = 40;

/// Plain and CURVE figures of one measurement: medians and 99th
/// percentiles, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// Measurements taken on each rig.
    pub n: usize,
    /// Plain ZeroMQ's median.
    pub plain_p50_us: f64,
    /// Plain ZeroMQ's 99th percentile.
    pub plain_p99_us: f64,
    /// CURVE's median.
    pub curve_p50_us: f64,
    /// CURVE's 99th percentile.
    pub curve_p99_us: f64,
}

impl Pair {
    /// CURVE's median over plain ZeroMQ's (above 1: CURVE is slower).
    pub fn ratio(&self) -> f64 {
        self.curve_p50_us / self.plain_p50_us
    }

    fn of(plain: &mut [f64], curve: &mut [f64]) -> Self {
        plain.sort_by(f64::total_cmp);
        curve.sort_by(f64::total_cmp);
        let at = |v: &[f64], p: f64| {
            let i = ((v.len() as f64 - 1.0) * p).round() as usize;
            v.get(i).copied().unwrap_or(f64::NAN) / 1e3
        };
        Self {
            n: plain.len().min(curve.len()),
            plain_p50_us: at(plain, 0.5),
            plain_p99_us: at(plain, 0.99),
            curve_p50_us: at(curve, 0.5),
            curve_p99_us: at(curve, 0.99),
        }
    }
}

/// What `ferry bench --curve` measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// A new instance started and registered.
    pub handshake: Pair,
    /// A hand-off of each size: (bytes, figures).
    pub handoffs: Vec<(u64, Pair)>,
    /// Two engines: a notification's round trip.
    pub notify_round_trip: Pair,
    /// Two engines: a write of each size with a notification, until the
    /// peer holds it: (bytes, figures).
    pub engine_writes: Vec<(u64, Pair)>,
}

/// The keys of one CURVE rig.
struct Keys {
    coordinator: CurveKeyPair,
    sender: CurveKeyPair,
    receiver: CurveKeyPair,
}

fn guard(
    keys: Option<&Keys>,
    key: impl Fn(&Keys) -> &CurveKeyPair,
    peers: &[&CurveKeyPair],
) -> Guard {
    Guard {
        allow: if keys.is_some() {
            vec![std::net::IpAddr::from([127, 0, 0, 1])]
        } else {
            Vec::new()
        },
        curve: keys.map(|k| CurveConfig {
            key: key(k).clone(),
            peers: peers.iter().map(|p| *p.public()).collect(),
        }),
    }
}

/// A coordinator, a sender and a receiver over ZeroMQ ([`crate::rig`]),
/// plain or CURVE.
struct Rig {
    nodes: crate::rig::Rig,
    keys: Option<Keys>,
}

impl Rig {
    fn new(curve: bool, slot: u64) -> Result<Self, NodeError> {
        let keys = if curve {
            let pair = || {
                CurveKeyPair::generate().map_err(|e| NodeError::Transport {
                    verb: "make a CURVE key pair",
                    kind: tensorferry_core::transport::FaultKind::Io,
                    source: Box::new(e),
                })
            };
            Some(Keys {
                coordinator: pair()?,
                sender: pair()?,
                receiver: pair()?,
            })
        } else {
            None
        };
        let k = keys.as_ref();
        let admitted: Vec<&CurveKeyPair> =
            k.map(|k| vec![&k.sender, &k.receiver]).unwrap_or_default();
        let guards = Guards {
            coordinator: guard(k, |k| &k.coordinator, &admitted),
            sender: instance_guard(k, |k| &k.sender),
            receiver: instance_guard(k, |k| &k.receiver),
        };
        let pools = Pools::fast_path(slot);
        let nodes =
            crate::rig::Rig::start(&DataPlane::default(), Control::Zmq, &guards, pools, None)?;
        Ok(Self { nodes, keys })
    }

    /// Starts a new receiver with a small pool and waits for its
    /// registration: how long that took (in ns).
    fn handshake(&self) -> Result<f64, NodeError> {
        let guard = instance_guard(self.keys.as_ref(), |k| &k.receiver);
        let t0 = Instant::now();
        let node = self.nodes.new_receiver(&guard, 1 << 20, Prealloc::NONE)?;
        let took = t0.elapsed();
        drop(node);
        Ok(took.as_nanos() as f64)
    }

    /// One hand-off of `spec` (in ns).
    fn handoff(
        &self,
        id: &str,
        spec: &[tensorferry_core::slots::TensorSpec<'_>],
    ) -> Result<f64, NodeError> {
        let staging = self.nodes.sender.stage(id, spec)?;
        let t0 = Instant::now();
        staging.commit("{}")?;
        let Some(d) = self.nodes.receiver.recv(Duration::from_secs(30)) else {
            return Err(NodeError::Timeout {
                what: "a benchmark hand-off",
                after: Duration::from_secs(30),
            });
        };
        let took = t0.elapsed();
        d.release();
        let _ = self.nodes.sender.next_outcome(Duration::from_secs(30));
        Ok(took.as_nanos() as f64)
    }
}

/// An instance's guard: its own key, admitting the coordinator's.
fn instance_guard(keys: Option<&Keys>, key: impl Fn(&Keys) -> &CurveKeyPair) -> Guard {
    let peers: Vec<&CurveKeyPair> = keys.map(|k| vec![&k.coordinator]).unwrap_or_default();
    guard(keys, key, &peers)
}

/// Measures both rigs in turns: the handshake, then hand-offs of each of
/// `sizes` for about `per_size` (at least 5 on each rig, at most 5,000);
/// `progress(size)` is told as each size starts.
pub fn measure(
    sizes: &[u64],
    per_size: Duration,
    mut progress: impl FnMut(u64),
) -> Result<Report, NodeError> {
    let largest = sizes.iter().copied().max().unwrap_or(4096);
    let slot = largest.next_power_of_two().max(1 << 20);
    let rigs = [Rig::new(false, slot)?, Rig::new(true, slot)?];
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..HANDSHAKES {
        // Alternate which goes first, so that neither always follows the
        // other.
        for r in [i % 2, 1 - i % 2] {
            times[r].push(rigs[r].handshake()?);
        }
    }
    let [mut plain, mut curve] = times;
    let handshake = Pair::of(&mut plain, &mut curve);
    let mut handoffs = Vec::new();
    for (n, &size) in sizes.iter().enumerate() {
        progress(size);
        let shape = [size];
        let spec = [crate::blob(&shape)];
        let mut times = [Vec::new(), Vec::new()];
        let start = Instant::now();
        let mut i = 0usize;
        // Two untimed rounds on each first: connections, mappings, caches.
        while i < 5_000 && (i < 7 || start.elapsed() < per_size) {
            for r in [i % 2, 1 - i % 2] {
                let took = rigs[r].handoff(&format!("c{n}-{i}"), &spec)?;
                if i >= 2 {
                    times[r].push(took);
                }
            }
            i += 1;
        }
        let [mut plain, mut curve] = times;
        handoffs.push((size, Pair::of(&mut plain, &mut curve)));
    }
    drop(rigs);
    let (notify_round_trip, engine_writes) = measure_engines(sizes, per_size, &mut progress)?;
    Ok(Report {
        handshake,
        handoffs,
        notify_round_trip,
        engine_writes,
    })
}

/// Two transfer engines on the local plane, each admitting the other
/// (guarded: an allow-list and CURVE on their inboxes), with `len` bytes
/// registered each.
struct Engines {
    a: tensorferry::engine::TransferEngine,
    b: tensorferry::engine::TransferEngine,
    a_session: String,
    b_session: String,
    // After the engines (fields drop in order): their registrations end
    // first.
    src: Vec<u8>,
    dst: Vec<u8>,
}

fn engine_error(e: tensorferry::engine::EngineError) -> NodeError {
    NodeError::Transport {
        verb: "run a benchmark engine",
        kind: e.kind(),
        source: Box::new(e),
    }
}

impl Engines {
    // The engine's `register` is unsafe (it hands memory to peers), and
    // this rig is the one place the bench crate registers raw memory.
    #[allow(unsafe_code)]
    fn new(guarded: bool, len: usize) -> Result<Self, NodeError> {
        use tensorferry::engine::{DataPlane, EngineConfig, LocalConfig, TransferEngine};
        let pair = || {
            CurveKeyPair::generate().map_err(|e| NodeError::Transport {
                verb: "make a CURVE key pair",
                kind: tensorferry_core::transport::FaultKind::Io,
                source: Box::new(e),
            })
        };
        let (ka, kb) = (pair()?, pair()?);
        // Before the engines, so that on every early return the engines
        // (and their registrations) drop before the memory does.
        let (src, dst) = (vec![1u8; len], vec![0u8; len]);
        let open = |me: &CurveKeyPair, peer: &CurveKeyPair| {
            let mut o = EngineConfig::default();
            o.guard = Some(if guarded {
                Guard {
                    allow: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                    curve: Some(CurveConfig {
                        key: me.clone(),
                        peers: vec![*peer.public()],
                    }),
                }
            } else {
                Guard::default()
            });
            TransferEngine::open_with(DataPlane::Local(LocalConfig::default()), o)
                .map_err(engine_error)
        };
        let (a, b) = (open(&ka, &kb)?, open(&kb, &ka)?);
        // SAFETY: both vectors outlive the engines' registrations (the
        // engines drop first, by field order), and `dst` is read by no one
        // while registered.
        unsafe {
            a.register(src.as_ptr() as u64, len as u64)
                .map_err(engine_error)?;
            b.register(dst.as_ptr() as u64, len as u64)
                .map_err(engine_error)?;
        }
        Ok(Self {
            a_session: a.session_id(),
            b_session: b.session_id(),
            a,
            b,
            src,
            dst,
        })
    }

    /// Waits (spinning: a latency is measured) for one notification at `e`.
    fn one(e: &tensorferry::engine::TransferEngine) -> Result<(), NodeError> {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if !e.notifications().map_err(engine_error)?.is_empty() {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(NodeError::Timeout {
                    what: "a benchmark notification",
                    after: Duration::from_secs(30),
                });
            }
            std::thread::yield_now();
        }
    }

    /// A notification from a to b and one back (in ns).
    fn round_trip(&self) -> Result<f64, NodeError> {
        let t0 = Instant::now();
        self.a
            .notify(&self.b_session, b"ping")
            .map_err(engine_error)?;
        Self::one(&self.b)?;
        self.b
            .notify(&self.a_session, b"pong")
            .map_err(engine_error)?;
        Self::one(&self.a)?;
        Ok(t0.elapsed().as_nanos() as f64)
    }

    /// A write of `len` bytes from a into b with a notification, until b
    /// holds it (in ns).
    fn write(&self, len: u64) -> Result<f64, NodeError> {
        let op = tensorferry::engine::Op {
            src: self.src.as_ptr() as u64,
            dst: self.dst.as_ptr() as u64,
            len,
        };
        let t0 = Instant::now();
        self.a
            .post_write(
                &self.b_session,
                &[op],
                Duration::from_secs(30),
                Some(b"done"),
            )
            .and_then(tensorferry::engine::Transfer::finish)
            .map_err(engine_error)?;
        Self::one(&self.b)?;
        Ok(t0.elapsed().as_nanos() as f64)
    }
}

/// The engines' figures, unguarded and guarded in turns: a
/// notification's round trip, then a write of each of `sizes` with a
/// notification.
fn measure_engines(
    sizes: &[u64],
    per_size: Duration,
    progress: &mut impl FnMut(u64),
) -> Result<(Pair, Vec<(u64, Pair)>), NodeError> {
    let largest = sizes.iter().copied().max().unwrap_or(4096);
    let len = usize::try_from(largest).unwrap_or(usize::MAX);
    let rigs = [Engines::new(false, len)?, Engines::new(true, len)?];
    let run = |f: &dyn Fn(&Engines) -> Result<f64, NodeError>| {
        let mut times = [Vec::new(), Vec::new()];
        let start = Instant::now();
        let mut i = 0usize;
        while i < 5_000 && (i < 7 || start.elapsed() < per_size) {
            for r in [i % 2, 1 - i % 2] {
                let took = f(&rigs[r])?;
                if i >= 2 {
                    times[r].push(took);
                }
            }
            i += 1;
        }
        let [mut plain, mut guarded] = times;
        Ok::<_, NodeError>(Pair::of(&mut plain, &mut guarded))
    };
    let round_trip = run(&|r: &Engines| r.round_trip())?;
    let mut writes = Vec::new();
    for &size in sizes {
        progress(size);
        writes.push((size, run(&|r: &Engines| r.write(size))?));
    }
    Ok((round_trip, writes))
}
