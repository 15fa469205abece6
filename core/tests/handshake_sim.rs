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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use ferry_core::handshake::coordinator::*;
use ferry_core::handshake::instance::*;
use ferry_core::handshake::{Instant, Limits};
use ferry_core::json::RawJson;
use ferry_core::transport::{Incoming, Landed, WriteTag};
use ferry_core::wire::{decode, Manifest, Msg, Shape, TensorEntry, TRANSFER_MAGIC};

const ROLES: [&str; 3] = ["encoder", "denoiser", "decoder"];
const PER_ROLE: usize = 2;
const N: usize = ROLES.len() * PER_ROLE;
const MIN_BLOCK: u64 = 512;
/// The largest pool; seeds under faults also run with an eighth of it,
/// tight enough for allocations to be rejected.
const POOL: u64 = 512 * MIN_BLOCK;
const PREALLOC: Prealloc = Prealloc {
    count: 2,
    size: 8 * MIN_BLOCK,
};

/// The one timeout of the sglang head the sglang-configured denoisers
/// serve under (its `--disagg-timeout`), scaled to the simulation's
/// clock: their timeouts follow from it by
/// [`InstanceConfig::under_sglang`], as the runtime's do.
const SGLANG_HEAD: Duration = Duration::from_millis(100);
const MS: u64 = 1_000_000;

#[derive(Clone, Copy, Debug)]
struct Faults {
    loss: f64,
    dup: f64,
    max_delay: u64,
    write_fail: f64,
    crash: f64,
    /// The data plane reports arrivals (completions do not mean delivery).
    notify: bool,
    /// There: the chance that a write's bytes arrive late, up to the
    /// receiver's landing limit plus most of its quarantine.
    late_land: f64,
    /// There: the chance that they never arrive.
    lost_land: f64,
}

impl Faults {
    const NONE: Faults = Faults {
        loss: 0.0,
        dup: 0.0,
        max_delay: 2 * MS,
        write_fail: 0.0,
        crash: 0.0,
        notify: false,
        late_land: 0.0,
        lost_land: 0.0,
    };
}

/// How long a receiver on a notifying data plane waits for a write to land
/// after `transfer_ready`, and how long its slots sit out a quarantine.
const LANDING: u64 = 30 * MS;
const QUARANTINE: u64 = 40 * MS;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

#[derive(Debug)]
enum Ev {
    ToCoord {
        from: usize,
        inc: u32,
        bytes: Vec<u8>,
    },
    ToInst {
        to: usize,
        inc: u32,
        bytes: Vec<u8>,
    },
    WriteLand {
        from: usize,
        inc: u32,
        token: Token,
        id: String,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: Vec<u8>,
        tag: WriteTag,
    },
    /// On a notifying data plane: a write's bytes arrive, after the
    /// sender's completion.
    Arrive {
        id: String,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: Vec<u8>,
        tag: WriteTag,
    },
    CoordTimer,
    InstTimer {
        i: usize,
        inc: u32,
    },
    Release {
        i: usize,
        inc: u32,
        token: Token,
    },
    Stage {
        i: usize,
    },
    Crash {
        i: usize,
    },
    Restart {
        i: usize,
    },
    /// A stop asked for: the instance drains.
    Stop {
        i: usize,
    },
    /// Its grace period is over: it leaves (a restart follows).
    Leave {
        i: usize,
        inc: u32,
    },
}

struct Node {
    inst: Option<Instance<'static>>,
    inc: u32,
    pool: Vec<u8>,
    session: String,
    timer: Option<u64>,
    /// The legs this incarnation staged.
    staged: Vec<Leg>,
    /// Its role's index in the pipeline.
    role: usize,
}

/// What one seed produced.
#[derive(Default, Debug)]
struct Outcome {
    reasons: HashMap<String, usize>,
    staged: usize,
    delivered: usize,
    failed: usize,
    verified: usize,
    /// Transfers refused because their write was not seen to land in time.
    never_landed: u64,
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

fn pattern(id: &str, i: usize) -> u8 {
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h >> (i % 8 * 8)) as u8 ^ (i as u8)
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

fn run(seed: u64, requests: usize, faults: Faults, pool: u64) -> Outcome {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let trace = std::env::var("FERRY_SIM_TRACE").is_ok_and(|v| v == seed.to_string());
    let forwarding = match seed % 3 {
        0 => Forwarding::NewId,
        1 => Forwarding::Forward,
        _ => Forwarding::SglangDenoisers,
    };
    let head_of = |i: usize| match forwarding {
        Forwarding::SglangDenoisers if i / PER_ROLE == 1 => Head::Sglang,
        _ => Head::Ferry,
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
        late_done_wait: Duration::from_millis(200),
    };
    // A request may live at most this long at the coordinator.
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
    let mut coord = Coordinator::new(&ROLES, cconfig, CoordinatorStorage::owned(&limits)).unwrap();

    let endpoints: Vec<String> = (0..N).map(|i| format!("tcp://10.0.0.{i}:5555")).collect();
    let roles: Vec<&'static str> = (0..N).map(|i| ROLES[i / PER_ROLE]).collect();

    let mut q: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut evs: Vec<Option<Ev>> = Vec::new();
    let mut seq = 0u64;
    let mut push = |q: &mut BinaryHeap<Reverse<(u64, u64, usize)>>,
                    evs: &mut Vec<Option<Ev>>,
                    at: u64,
                    ev: Ev| {
        seq += 1;
        evs.push(Some(ev));
        q.push(Reverse((at, seq, evs.len() - 1)));
    };

    let plane = Plane {
        pool,
        landing: faults.notify.then_some(Duration::from_nanos(LANDING)),
    };
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..N {
        let (inst, session) = start_instance(i, 0, 0, roles[i], &endpoints[i], plane, head_of(i));
        nodes.push(Node {
            inst: Some(inst),
            inc: 0,
            pool: vec![0; POOL as usize],
            session,
            timer: None,
            staged: Vec::new(),
            role: i / PER_ROLE,
        });
    }
    let crashes_left = &mut [3u32; N];

    let mut out = Outcome::default();
    let mut first_seen: HashMap<Leg, u64> = HashMap::new();
    let mut expected: HashMap<Leg, Vec<u8>> = HashMap::new();
    // Legs that ended at their sender: never seen by the coordinator
    // (staged timeout), or their sender crashed.
    let mut ended_at_sender: std::collections::HashSet<Leg> = Default::default();
    let mut ended_at_coord: std::collections::HashSet<Leg> = Default::default();
    let mut staged_at: HashMap<Leg, u64> = HashMap::new();
    let sender_bound = bound.max(1500 * MS) + 10 * MS;
    let mut buf = vec![0u8; 64 * 1024];
    let mut coord_timer: Option<u64> = None;
    let mut staged_count = 0usize;

    // Each instance starts by sending its registration.
    for i in 0..N {
        push(&mut q, &mut evs, 0, Ev::InstTimer { i, inc: 0 });
    }
    // Encoders stage requests at random times over the first second or so.
    for _ in 0..requests {
        // Spread over a second (longer for long runs): queues form, drain.
        let at = rng.below(MS * 1000u64.max(requests as u64 / 2));
        let i = rng.below(PER_ROLE as u64) as usize;
        push(&mut q, &mut evs, at, Ev::Stage { i });
    }
    if faults.crash > 0.0 {
        for _ in 0..3 {
            let at = rng.below(1000 * MS);
            let i = rng.below(N as u64) as usize;
            push(&mut q, &mut evs, at, Ev::Crash { i });
        }
        for _ in 0..2 {
            let at = rng.below(1000 * MS);
            let i = rng.below(N as u64) as usize;
            push(&mut q, &mut evs, at, Ev::Stop { i });
        }
    }

    let mut steps = 0u64;
    while let Some(Reverse((at, _, idx))) = q.pop() {
        steps += 1;
        assert!(
            steps < 50_000_000,
            "seed {seed}: simulation does not settle"
        );
        let now = at;
        let Some(ev) = evs[idx].take() else { continue };
        if trace {
            match &ev {
                Ev::ToCoord { from, inc, bytes } => println!(
                    "{:>9} inst{from}.{inc} -> coord: {}",
                    now / 1000,
                    String::from_utf8_lossy(bytes)
                ),
                Ev::ToInst { to, inc, bytes } => println!(
                    "{:>9} coord -> inst{to}.{inc}: {}",
                    now / 1000,
                    String::from_utf8_lossy(bytes)
                ),
                Ev::WriteLand {
                    from,
                    to,
                    to_inc,
                    offset,
                    id,
                    data,
                    ..
                } => println!(
                    "{:>9} write {id} inst{from} -> inst{to}.{to_inc} @{offset} len {}",
                    now / 1000,
                    data.len()
                ),
                Ev::Arrive {
                    to,
                    to_inc,
                    offset,
                    id,
                    data,
                    ..
                } => println!(
                    "{:>9} bytes of {id} arrive at inst{to}.{to_inc} @{offset} len {}",
                    now / 1000,
                    data.len()
                ),
                Ev::Crash { i } => println!("{:>9} crash inst{i}", now / 1000),
                Ev::Restart { i } => println!("{:>9} restart inst{i}", now / 1000),
                Ev::Stop { i } => println!("{:>9} stop inst{i}: drain", now / 1000),
                Ev::Leave { i, inc } => println!("{:>9} inst{i}.{inc} leaves", now / 1000),
                _ => {}
            }
        }
        let mut touched_coord = false;
        let mut touched: Vec<usize> = Vec::new();
        match ev {
            Ev::ToCoord { from, bytes, .. } => {
                // Messages of a dead incarnation still in flight arrive
                // like any other, as they would on a real network.
                let msg = decode(&bytes).expect("instances send valid messages");
                let staged = match &msg {
                    Msg::Staged(m) => Some(m.request_id),
                    Msg::Done(d) if d.staged_for_decoder => Some(d.request_id),
                    _ => None,
                };
                if let Some(id) = staged {
                    first_seen
                        .entry((id.to_string(), from / PER_ROLE))
                        .or_insert(now);
                }
                // The coordinator names the sender by the endpoint the
                // channel reports, as the runtime's does.
                let incoming = Incoming {
                    from: &endpoints[from],
                    via: "tcp://coordinator:5555",
                    magic: TRANSFER_MAGIC,
                    payload: &bytes,
                };
                let _ = coord.handle_incoming(Instant(now), &incoming);
                touched_coord = true;
            }
            Ev::ToInst { to, inc, bytes } => {
                let node = &mut nodes[to];
                if node.inc == inc {
                    if let Some(inst) = node.inst.as_mut() {
                        let msg = decode(&bytes).expect("the coordinator sends valid messages");
                        let _ = inst.handle(Instant(now), &msg);
                        touched.push(to);
                    }
                }
            }
            Ev::WriteLand {
                from,
                inc,
                token,
                id,
                to,
                to_inc,
                offset,
                data,
                tag,
            } => {
                let live = nodes[to].inc == to_inc
                    && nodes[to].inst.as_ref().is_some_and(|x| !x.is_leaving());
                let ok = if rng.chance(faults.write_fail) {
                    false
                } else if faults.notify {
                    // The write completes at the sender; its bytes come
                    // later (maybe much later, maybe never).
                    if live && !rng.chance(faults.lost_land) {
                        let delay = if rng.chance(faults.late_land) {
                            LANDING / 2 + rng.below(LANDING / 2 + QUARANTINE / 2)
                        } else {
                            rng.below(MS)
                        };
                        let arrive = Ev::Arrive {
                            id,
                            to,
                            to_inc,
                            offset,
                            data,
                            tag,
                        };
                        push(&mut q, &mut evs, now + delay, arrive);
                    }
                    true
                } else if live {
                    land(
                        &mut nodes[to],
                        &coord,
                        seed,
                        &id,
                        &endpoints[to],
                        offset,
                        &data,
                    );
                    true
                } else {
                    false
                };
                if nodes[from].inc == inc {
                    if let Some(inst) = nodes[from].inst.as_mut() {
                        let _ = inst.handle_completion(
                            Instant(now),
                            token,
                            if ok { Ok(()) } else { Err("write failed") },
                        );
                        touched.push(from);
                    }
                }
            }
            Ev::Arrive {
                id,
                to,
                to_inc,
                offset,
                data,
                tag,
            } => {
                // An instance that left is as good as gone: its pool is
                // about to be unmapped.
                if nodes[to].inc == to_inc
                    && nodes[to].inst.as_ref().is_some_and(|x| !x.is_leaving())
                {
                    land(
                        &mut nodes[to],
                        &coord,
                        seed,
                        &id,
                        &endpoints[to],
                        offset,
                        &data,
                    );
                    // Its data plane reports the arrival at once, whether
                    // or not the transfer_ready came yet, naming it as
                    // libfabric's wide notices do: by 40 bits of its tag.
                    if let Some(inst) = nodes[to].inst.as_mut() {
                        inst.handle_landed(Instant(now), Landed::low_bits(tag.0, 40));
                    }
                    touched.push(to);
                }
            }
            Ev::CoordTimer => {
                coord_timer = None;
                coord.handle_timeout(Instant(now));
                touched_coord = true;
            }
            Ev::InstTimer { i, inc } => {
                if nodes[i].inc == inc {
                    nodes[i].timer = None;
                    if let Some(inst) = nodes[i].inst.as_mut() {
                        inst.handle_timeout(Instant(now));
                        touched.push(i);
                    }
                }
            }
            Ev::Release { i, inc, token } => {
                let rx = match (nodes[i].inc == inc, nodes[i].inst.as_ref()) {
                    (true, Some(inst)) => inst
                        .received(token)
                        .map(|rx| (rx.id.to_string(), rx.slot_offset)),
                    _ => None,
                };
                if let Some((id, slot_offset)) = rx {
                    // Verify and forward before letting go.
                    let role = i / PER_ROLE;
                    let leg = (id.clone(), role - 1);
                    let len = expected.get(&leg).map_or(0, Vec::len);
                    let data = nodes[i].pool[slot_offset as usize..][..len].to_vec();
                    if let Some(want) = expected.get(&leg) {
                        assert_eq!(&data, want, "seed {seed}: bytes of {id} differ");
                        out.verified += 1;
                    }
                    // The denoiser passes the request on, transformed.
                    let next: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
                    match forwarding {
                        _ if role != 1 => {
                            if let Some(inst) = nodes[i].inst.as_mut() {
                                inst.release(token, None).unwrap();
                            }
                        }
                        Forwarding::NewId => {
                            if let Some(inst) = nodes[i].inst.as_mut() {
                                inst.release(token, None).unwrap();
                            }
                            let next_id = format!("{id}/d");
                            staged_at.insert((next_id.clone(), role), now);
                            stage_request(
                                &mut nodes[i],
                                &next_id,
                                &next,
                                now,
                                &mut expected,
                                &mut staged_count,
                                None,
                            );
                        }
                        Forwarding::Forward | Forwarding::SglangDenoisers => {
                            staged_at.insert((id.clone(), role), now);
                            let sent = stage_request(
                                &mut nodes[i],
                                &id,
                                &next,
                                now,
                                &mut expected,
                                &mut staged_count,
                                Some(token),
                            );
                            if !sent {
                                // No room for the next leg: let go of the
                                // input all the same.
                                if let Some(inst) = nodes[i].inst.as_mut() {
                                    inst.release(token, None).unwrap();
                                }
                            }
                        }
                    }
                    touched.push(i);
                } else if nodes[i].inc == inc {
                    if let Some(inst) = nodes[i].inst.as_mut() {
                        // Aborted and gone already, or a stale token.
                        let _ = inst.release(token, None);
                        touched.push(i);
                    }
                }
            }
            Ev::Stage { i } => {
                let id = format!("s{seed}-r{}", staged_count);
                let len = 1 + rng.below(12 * MIN_BLOCK) as usize;
                let data: Vec<u8> = (0..len).map(|k| pattern(&id, k)).collect();
                if nodes[i].inst.is_some() {
                    staged_at.insert((id.clone(), 0), now);
                    stage_request(
                        &mut nodes[i],
                        &id,
                        &data,
                        now,
                        &mut expected,
                        &mut staged_count,
                        None,
                    );
                    touched.push(i);
                }
            }
            Ev::Crash { i } => {
                // One that left is gone already (its restart is due).
                let up = nodes[i].inst.as_ref().is_some_and(|x| !x.is_leaving());
                if crashes_left[i] > 0 && up {
                    crashes_left[i] -= 1;
                    // What it had staged dies with it.
                    ended_at_sender.extend(nodes[i].staged.drain(..));
                    nodes[i].inst = None;
                    nodes[i].inc += 1;
                    let back = now + 5 * MS + rng.below(50 * MS);
                    push(&mut q, &mut evs, back, Ev::Restart { i });
                }
            }
            Ev::Stop { i } => {
                let inc = nodes[i].inc;
                if let Some(inst) = nodes[i].inst.as_mut() {
                    if !inst.is_draining() {
                        inst.drain(Instant(now));
                        touched.push(i);
                        let grace = rng.below(60 * MS);
                        push(&mut q, &mut evs, now + grace, Ev::Leave { i, inc });
                    }
                }
            }
            Ev::Leave { i, inc } => {
                if nodes[i].inc == inc {
                    if let Some(inst) = nodes[i].inst.as_mut() {
                        inst.leave(Instant(now), "stopped");
                        // Its messages go out; then the process ends, and
                        // another starts on the endpoint.
                        touched.push(i);
                        let back = now + 5 * MS + rng.below(50 * MS);
                        push(&mut q, &mut evs, back, Ev::Restart { i });
                    }
                }
            }
            Ev::Restart { i } => {
                let leaving = nodes[i].inst.as_ref().map(Instance::has_left);
                if leaving == Some(false) {
                    // Its writes are not all in yet: the process waits for
                    // them before it ends.
                    push(&mut q, &mut evs, now + MS, Ev::Restart { i });
                    continue;
                }
                if leaving == Some(true) {
                    // What is still addressed to the one that left is lost.
                    nodes[i].inc += 1;
                }
                let inc = nodes[i].inc;
                let (inst, session) =
                    start_instance(i, inc, now, roles[i], &endpoints[i], plane, head_of(i));
                nodes[i].inst = Some(inst);
                nodes[i].session = session;
                nodes[i].pool.fill(0);
                nodes[i].timer = None;
                touched.push(i);
            }
        }

        // Drain the coordinator's output.
        if touched_coord {
            while let Some(r) = coord.poll_transmit(&mut buf) {
                let t = r.expect("transmit buffer large enough");
                let to = coord
                    .endpoint_of(t.to)
                    .and_then(|ep| endpoints.iter().position(|e| e == ep))
                    .expect("the coordinator answers only endpoints it was sent from");
                let bytes = buf[..t.len].to_vec();
                let inc = nodes[to].inc;
                send(
                    &mut rng,
                    &faults,
                    now,
                    &mut |at, b| push(&mut q, &mut evs, at, Ev::ToInst { to, inc, bytes: b }),
                    bytes,
                );
            }
            while let Some(e) = coord.poll_event() {
                match e {
                    CoordinatorEvent::Delivered { id, leg, timing } => {
                        out.delivered += 1;
                        let key = (id.to_string(), leg);
                        let t0 = first_seen.get(&key).copied().unwrap_or(now);
                        // The phases follow one another within the leg's
                        // life at the coordinator.
                        let phases = timing.queued + timing.written + timing.consumed;
                        assert!(
                            phases <= Duration::from_nanos(now - t0),
                            "seed {seed}: {id} (leg {leg}) phases {timing:?} exceed its {} ns",
                            now - t0
                        );
                        assert!(
                            ended_at_coord.insert(key),
                            "seed {seed}: {id} (leg {leg}) ended twice"
                        );
                        assert!(
                            now - t0 <= bound,
                            "seed {seed}: {id} took {} ms",
                            (now - t0) / MS
                        );
                    }
                    CoordinatorEvent::Failed { id, leg, reason } => {
                        out.failed += 1;
                        let key = (id.to_string(), leg);
                        let t0 = first_seen.get(&key).copied().unwrap_or(now);
                        ended_at_coord.insert(key);
                        *out.reasons.entry(reason.as_str().to_string()).or_default() += 1;
                        assert!(
                            now - t0 <= bound,
                            "seed {seed}: {id} failed after {} ms",
                            (now - t0) / MS
                        );
                    }
                    CoordinatorEvent::Registered { .. }
                    | CoordinatorEvent::Refused { .. }
                    | CoordinatorEvent::Deregistered { .. } => {}
                }
            }
            if let Some(t) = coord.poll_timeout() {
                if coord_timer.is_none_or(|c| t.0 < c) {
                    coord_timer = Some(t.0.max(now));
                    push(&mut q, &mut evs, t.0.max(now), Ev::CoordTimer);
                }
            }
        }
        // Drain the touched instances' output.
        touched.sort_unstable();
        touched.dedup();
        for i in touched {
            let inc = nodes[i].inc;
            let Some(inst) = nodes[i].inst.as_mut() else {
                continue;
            };
            while let Some(r) = inst.poll_transmit(&mut buf) {
                let n = r.expect("transmit buffer large enough");
                let bytes = buf[..n].to_vec();
                send(
                    &mut rng,
                    &faults,
                    now,
                    &mut |at, b| {
                        push(
                            &mut q,
                            &mut evs,
                            at,
                            Ev::ToCoord {
                                from: i,
                                inc,
                                bytes: b,
                            },
                        )
                    },
                    bytes,
                );
            }
            let mut writes = Vec::new();
            while let Some(w) = inst.poll_action() {
                writes.push(w);
            }
            for w in writes {
                // Find the receiver by session; a dead session fails the write.
                let target = nodes
                    .iter()
                    .position(|n| n.inst.is_some() && n.session == w.dest_session.as_str());
                let data = nodes[i].pool[w.local_offset as usize..][..w.len as usize].to_vec();
                let at = now + 1 + rng.below(3 * MS);
                let (to, to_inc, offset) = match target {
                    Some(t) => (
                        t,
                        nodes[t].inc,
                        w.dest_addr.wrapping_sub(pool_ptr(t, nodes[t].inc)),
                    ),
                    None => (i, u32::MAX, 0),
                };
                push(
                    &mut q,
                    &mut evs,
                    at,
                    Ev::WriteLand {
                        from: i,
                        inc,
                        token: w.token,
                        id: w.id.to_string(),
                        to,
                        to_inc,
                        offset,
                        data,
                        tag: w.tag,
                    },
                );
            }
            let inst = nodes[i].inst.as_mut().unwrap();
            let mut received = Vec::new();
            while let Some(e) = inst.poll_event() {
                match e {
                    InstanceEvent::Received(token) => received.push(token),
                    InstanceEvent::SendFailed { id, .. } => {
                        // Ends within the sender's own staged timeout at most.
                        let key = (id.to_string(), i / PER_ROLE);
                        if let Some(t0) = staged_at.get(&key) {
                            assert!(
                                now - t0 <= sender_bound,
                                "seed {seed}: {id} ended at its sender after {} ms",
                                (now - t0) / MS
                            );
                        }
                        ended_at_sender.insert(key);
                    }
                    _ => {}
                }
            }
            for token in received {
                let at = now + rng.below(5 * MS);
                push(&mut q, &mut evs, at, Ev::Release { i, inc, token });
            }
            let inst = nodes[i].inst.as_ref().unwrap();
            if let Some(t) = inst.poll_timeout() {
                if nodes[i].timer.is_none_or(|c| t.0 < c) {
                    nodes[i].timer = Some(t.0.max(now));
                    push(&mut q, &mut evs, t.0.max(now), Ev::InstTimer { i, inc });
                }
            }
        }
    }
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
    assert_eq!(
        coord.in_flight(),
        0,
        "seed {seed}: requests still in flight"
    );
    assert_eq!(
        coord.prealloc_taken(),
        0,
        "seed {seed}: preallocated slots still taken at the coordinator"
    );
    for (peer, used) in coord.capacity_in_use() {
        assert_eq!(used, 0, "seed {seed}: capacity of {peer:?} not released");
    }
    for (i, n) in nodes.iter().enumerate() {
        let Some(inst) = n.inst.as_ref() else {
            continue;
        };
        out.never_landed += inst.stats().never_landed;
        assert_eq!(
            inst.requests_held(),
            0,
            "seed {seed}: instance {i} holds requests"
        );
        assert_eq!(
            inst.prealloc_in_use(),
            0,
            "seed {seed}: instance {i} preallocated slots in use"
        );
        assert_eq!(
            inst.pool().stats().live_slots,
            PREALLOC.count as u64,
            "seed {seed}: instance {i} leaks pool slots"
        );
    }
    out
}

/// What an instance's pool and data plane are like.
#[derive(Clone, Copy)]
struct Plane {
    /// The pool's size.
    pool: u64,
    /// The instance's landing limit, where the data plane reports arrivals.
    landing: Option<Duration>,
}

fn start_instance(
    i: usize,
    inc: u32,
    now: u64,
    role: &'static str,
    endpoint: &str,
    plane: Plane,
    head: Head,
) -> (Instance<'static>, String) {
    let Plane { pool, landing } = plane;
    let session = format!("sess-{i}-{inc}");
    let who = InstanceIdentity {
        role,
        session_id: &session,
        work_endpoint: endpoint,
        pool_ptr: pool_ptr(i, inc),
        pool_size: pool,
        delivery_complete: landing.is_none(),
    };
    let ferry = InstanceConfig {
        min_block: MIN_BLOCK,
        prealloc: PREALLOC,
        register_retry: Duration::from_millis(20),
        staged_timeout: Duration::from_millis(1500),
        reserved_timeout: Duration::from_millis(1500),
        quarantine: Duration::from_nanos(QUARANTINE),
        landing_timeout: landing.unwrap_or(Duration::from_millis(100)),
        head: Head::Ferry,
        alloc_hold: Duration::from_millis(100),
    };
    // Under sglang's head, the policy the runtime uses, for a head whose
    // one timeout is `SGLANG_HEAD`: a held ALLOC outlives the
    // coordinator's alloc timeout and more (its patience under faults).
    let config = match head {
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
    let storage = InstanceStorage::owned(&limits, &config.pool(pool), PREALLOC.count).unwrap();
    (
        Instance::new(Instant(now), &who, &config, storage).unwrap(),
        session,
    )
}

/// Lands the bytes of a write for `id` at `offset` of instance `to`, first
/// checking that they lie inside a slot reserved for its request: by the
/// receiver (reserved, landing, delivered or quarantined), or (fast path)
/// preallocated and assigned to it by the coordinator.
fn land(
    node: &mut Node,
    coord: &Coordinator<'_>,
    seed: u64,
    id: &str,
    to: &str,
    offset: u64,
    data: &[u8],
) {
    let Some(inst) = node.inst.as_ref() else {
        return;
    };
    let prealloc = coord
        .peer_at(to)
        .and_then(|peer| coord.prealloc_for(id, peer));
    let inside = |(o, s): (u64, u64)| offset >= o && offset + data.len() as u64 <= o + s;
    assert!(
        inst.slot_for(id).is_some_and(inside) || prealloc.is_some_and(inside),
        "seed {seed}: write for {id} lands at {offset} of instance {to}, outside any slot reserved for it"
    );
    node.pool[offset as usize..offset as usize + data.len()].copy_from_slice(data);
}

fn pool_ptr(i: usize, inc: u32) -> u64 {
    0x10_0000_0000 * (i as u64 + 1) + u64::from(inc) * 0x1_0000_0000
}

/// Stages `data` as request `id` at `node` (the next leg of the delivery
/// `forward_of`, if given, which ends with it); false if the instance had no
/// room.
fn stage_request(
    node: &mut Node,
    id: &str,
    data: &[u8],
    now: u64,
    expected: &mut HashMap<Leg, Vec<u8>>,
    count: &mut usize,
    forward_of: Option<Token>,
) -> bool {
    let leg = node.role;
    let Some(inst) = node.inst.as_mut() else {
        return false;
    };
    let Ok((token, offset)) = inst.stage(id, data.len() as u64) else {
        return false;
    };
    node.pool[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    let dims = [data.len() as u64];
    let entries = [TensorEntry {
        field: "x".into(),
        list_index: None,
        offset: 0,
        shape: Shape::Dims(&dims),
        dtype: "uint8".into(),
    }];
    let scalars = RawJson::parse_object(r#"{"step":1,"cfg":1e-05}"#).unwrap();
    let manifest = Manifest::Entries(&entries);
    let len = data.len() as u64;
    match forward_of {
        Some(rx) => inst
            .forward(Instant(now), rx, token, len, &manifest, scalars)
            .unwrap(),
        None => inst
            .commit(Instant(now), token, len, &manifest, scalars)
            .unwrap(),
    }
    expected.insert((id.to_string(), leg), data.to_vec());
    node.staged.push((id.to_string(), leg));
    *count += 1;
    true
}

/// Puts `bytes` on the wire with the seed's faults: maybe lost, maybe
/// twice, always after a random delay (so reordered).
fn send(
    rng: &mut Rng,
    f: &Faults,
    now: u64,
    deliver: &mut dyn FnMut(u64, Vec<u8>),
    bytes: Vec<u8>,
) {
    if rng.chance(f.loss) {
        return;
    }
    let copies = if rng.chance(f.dup) { 2 } else { 1 };
    for _ in 0..copies {
        deliver(now + 1 + rng.below(f.max_delay), bytes.clone());
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn without_faults_every_request_is_delivered_intact() {
    let seeds = env("FERRY_SIM_SEEDS", 10_000);
    let requests = env("FERRY_SIM_REQUESTS", 1_000) as usize;
    let only: Option<u64> = std::env::var("FERRY_SIM_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for seed in 0..seeds.max(1) {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
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
    }
}

#[test]
fn under_faults_every_request_ends_and_nothing_leaks() {
    let seeds = env("FERRY_SIM_SEEDS", 10_000);
    let requests = env("FERRY_SIM_REQUESTS", 1_000) as usize;
    let mut totals = Outcome::default();
    let mut ran = 0u64;
    let only: Option<u64> = std::env::var("FERRY_SIM_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for seed in 0..seeds {
        if only.is_some_and(|o| o != seed) {
            continue;
        }
        let mut rng = Rng(seed ^ 0xABCDEF);
        let faults = Faults {
            loss: [0.0, 0.01, 0.05][rng.below(3) as usize],
            dup: [0.0, 0.02, 0.1][rng.below(3) as usize],
            max_delay: [1, 5, 20][rng.below(3) as usize] * MS,
            write_fail: [0.0, 0.05][rng.below(2) as usize],
            crash: [0.0, 1.0][rng.below(2) as usize],
            notify: seed % 3 == 2,
            late_land: [0.0, 0.05][rng.below(2) as usize],
            lost_land: [0.0, 0.02][rng.below(2) as usize],
        };
        let pool = if seed % 2 == 0 { POOL } else { POOL / 8 };
        // Twice the requests of the fault-free runs: under faults about
        // half fail before they are forwarded.
        let o = run(1_000_000 + seed, 2 * requests, faults, pool);
        ran += 1;
        totals.staged += o.staged;
        totals.delivered += o.delivered;
        totals.failed += o.failed;
        totals.verified += o.verified;
        totals.never_landed += o.never_landed;
        for (k, v) in o.reasons {
            *totals.reasons.entry(k).or_default() += v;
        }
    }
    println!("{seeds} seeds under faults: {totals:?}");
    assert!(totals.delivered > 0 && totals.failed > 0, "{totals:?}");
    // The notifying data plane's faults were met: transfers refused for
    // bytes that never came, or came after the landing limit.
    if ran >= 30 {
        assert!(totals.never_landed > 0, "{totals:?}");
    }
}
