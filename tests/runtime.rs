//! The std runtime over real parts: a coordinator and instances as threads
//! of this process, talking over Unix sockets and writing into each other's
//! shared-memory pools.

mod common;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use common::endpoint;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNode, InstanceNodeConfig, Prealloc,
};

use tensorferry_core::slots::{Dtype, TensorSpec};
use tensorferry_core::transport::{ControlChannel, ControlSend};
use tensorferry_shm::UdsChannel;

const SECOND: Duration = Duration::from_secs(1);

fn coordinator(pipeline: &[&str]) -> CoordinatorNode {
    coordinator_with(CoordinatorNodeConfig::new(pipeline))
}

fn coordinator_with(settings: CoordinatorNodeConfig) -> CoordinatorNode {
    let ch = UdsChannel::bind(&endpoint("coord")).unwrap();
    CoordinatorNode::start(&settings, ch, |_| {}).unwrap()
}

/// Waits for the coordinator to have seen `n` deliveries.
fn wait_delivered(coord: &CoordinatorNode, n: u64) {
    for _ in 0..500 {
        if coord.snapshot().stats.delivered >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{:?}", coord.snapshot());
}

fn instance(role: &str, coord: &CoordinatorNode, prealloc: Prealloc) -> InstanceNode {
    let mut s = InstanceNodeConfig::new(role, coord.endpoint());
    s.config.prealloc = prealloc;
    let node = DataPlane::default()
        .start_instance_at(&s, 64 << 20, &endpoint(role))
        .unwrap();
    node.wait_registered(5 * SECOND).unwrap();
    node
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Stages one request with two tensors filled from `seed`.
fn send(node: &InstanceNode, id: &str, seed: u8) {
    let (a, b) = ([1u64, 77, 33], [5u64, 1000]);
    let specs = [
        TensorSpec {
            field: "prompt_embeds",
            list_index: None,
            shape: &a,
            dtype: Dtype::BFloat16,
            byte_len: 2 * 77 * 33,
        },
        TensorSpec {
            field: "latents",
            list_index: Some(0),
            shape: &b,
            dtype: Dtype::Float32,
            byte_len: 4 * 5000,
        },
    ];
    let mut staging = node.stage(id, &specs).unwrap();
    for i in 0..2 {
        let t = staging.tensor_mut(i).unwrap();
        let p = pattern(seed.wrapping_add(i as u8), t.len());
        t.copy_from_slice(&p);
    }
    staging
        .commit(r#"{"prompt":"a fox","steps":30,"cfg":7.5}"#)
        .unwrap();
}

/// Receives request `id` and checks every byte against `seed`.
fn check(node: &InstanceNode, id: &str, seed: u8) {
    let d = node.recv(5 * SECOND).expect("a delivery");
    assert_eq!(d.id(), id);
    check_bytes(&d, seed);
    d.release();
}

/// Checks every byte of a delivery made by [`send`] with `seed`.
fn check_bytes(d: &tensorferry::runtime::Delivery<'_>, seed: u8) {
    assert_eq!(
        d.scalar_fields(),
        r#"{"prompt":"a fox","steps":30,"cfg":7.5}"#
    );
    let tensors: Vec<_> = d.tensors().collect();
    assert_eq!(tensors.len(), 2);
    assert_eq!(tensors[0].field.raw(), "prompt_embeds");
    assert_eq!(tensors[0].dtype, Dtype::BFloat16);
    assert_eq!(tensors[0].dims().collect::<Vec<_>>(), [1, 77, 33]);
    assert_eq!(
        (tensors[1].field.raw(), tensors[1].list_index),
        ("latents", Some(0))
    );
    for (i, t) in tensors.iter().enumerate() {
        assert_eq!(t.bytes, pattern(seed.wrapping_add(i as u8), t.bytes.len()));
    }
}

fn assert_idle(node: &InstanceNode) {
    for _ in 0..200 {
        let s = node.stats();
        if s.requests_held == 0 && s.live_slots == s.prealloc_slots as u64 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("slots still held: {:?}", node.stats());
}

#[test]
fn hand_offs_over_both_paths_deliver_every_byte() {
    let coord = coordinator(&["encoder", "denoiser"]);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    // Two preallocated slots: the fast path; more requests take the slow one.
    let den = instance(
        "denoiser",
        &coord,
        Prealloc {
            count: 2,
            size: 1 << 20,
        },
    );
    for round in 0..20u8 {
        let ids: Vec<String> = (0..4).map(|i| format!("r{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            send(&enc, id, round.wrapping_mul(7).wrapping_add(i as u8));
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            let d = den.recv(5 * SECOND).expect("a delivery");
            got.push(d.id().to_owned());
            let i: usize = d.id().rsplit('-').next().unwrap().parse().unwrap();
            let seed = round.wrapping_mul(7).wrapping_add(i as u8);
            for (k, t) in d.tensors().enumerate() {
                assert_eq!(t.bytes, pattern(seed.wrapping_add(k as u8), t.bytes.len()));
            }
            d.release();
        }
        got.sort();
        assert_eq!(got, ids);
        for _ in 0..4 {
            assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
        }
    }
    assert_idle(&enc);
    assert_idle(&den);
    wait_delivered(&coord, 80);
    let snap = coord.snapshot();
    assert_eq!(snap.stats.delivered, 80);
    assert!(
        snap.stats.fast_path > 0 && snap.stats.fast_path < 80,
        "{snap:?}"
    );
    // Each write moves the slot's data: 5,082 bytes padded to 5,120, then
    // 20,000 padded to 20,480.
    assert_eq!(enc.stats().metrics.bytes_written, 80 * 25_600);
}

#[test]
fn one_request_passes_through_three_roles_under_its_own_id() {
    let coord = coordinator(&["encoder", "denoiser", "decoder"]);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    let den = instance(
        "denoiser",
        &coord,
        Prealloc {
            count: 1,
            size: 1 << 20,
        },
    );
    let dec = instance("decoder", &coord, Prealloc::NONE);
    send(&enc, "req-1", 3);
    let input = den.recv(5 * SECOND).expect("at the denoiser");
    // Forward before letting go of the input, as a denoiser would.
    send(&den, "req-1", 9);
    input.release();
    check(&dec, "req-1", 9);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
    assert!(den.next_outcome(5 * SECOND).unwrap().sent);
    for n in [&enc, &den, &dec] {
        assert_idle(n);
    }
}

#[test]
fn without_a_live_receiver_a_request_fails_and_a_new_receiver_takes_over() {
    let mut settings = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    settings.config.timeouts.queued = Duration::from_millis(300);
    let coord = coordinator_with(settings);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    let den = instance("denoiser", &coord, Prealloc::NONE);
    send(&enc, "ok-1", 1);
    check(&den, "ok-1", 1);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
    // The receiver goes away: its pool object is unlinked and its
    // connections close, so the coordinator drops it at once.
    drop(den);
    for _ in 0..500 {
        if coord.snapshot().members == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(coord.snapshot().members, 1);
    send(&enc, "lost-1", 2);
    let o = enc.next_outcome(10 * SECOND).expect("an outcome");
    assert_eq!((o.id.as_str(), o.sent), ("lost-1", false));
    // A new receiver takes over.
    let den2 = instance("denoiser", &coord, Prealloc::NONE);
    send(&enc, "ok-2", 4);
    check(&den2, "ok-2", 4);
    assert_idle(&enc);
    assert_idle(&den2);
}

#[test]
fn under_injected_faults_every_request_ends_and_no_slot_leaks() {
    use tensorferry::fault::{FaultPlan, FaultyChannel, FaultyTransport};
    use tensorferry_core::handshake::coordinator::Timeouts;

    let plan = |seed| FaultPlan {
        fail_write: 0.1,
        delay_write: 0.05,
        drop: 0.02,
        duplicate: 0.03,
        delay_message: 0.05,
        lose_notice: 0.0,
        delay: Duration::from_millis(30),
        seed,
    };
    let mut cs = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    cs.config.timeouts = Timeouts {
        queued: Duration::from_secs(2),
        alloc: Duration::from_millis(300),
        push: Duration::from_millis(500),
        done: Duration::from_secs(1),
    };
    cs.config.quarantine = Duration::from_millis(200);
    cs.config.late_done_wait = Duration::from_millis(500);
    let ch = FaultyChannel::new(UdsChannel::bind(&endpoint("coord")).unwrap(), plan(1));
    let coord = CoordinatorNode::start(&cs, ch, |_| {}).unwrap();
    let settings = |role: &str, prealloc| {
        let mut s = InstanceNodeConfig::new(role, coord.endpoint());
        s.config.prealloc = prealloc;
        s.config.register_retry = Duration::from_millis(50);
        s.config.staged_timeout = Duration::from_secs(4);
        s.config.reserved_timeout = Duration::from_secs(1);
        s.config.quarantine = Duration::from_millis(200);
        s
    };
    let uds = |role| UdsChannel::bind(&endpoint(role)).unwrap();
    let enc = DataPlane::default()
        .start_instance_with(
            &settings("encoder", Prealloc::NONE),
            64 << 20,
            FaultyChannel::new(uds("encoder"), plan(3)),
            |t| FaultyTransport::new(t, plan(2)),
        )
        .unwrap();
    let den = DataPlane::default()
        .start_instance(
            &settings(
                "denoiser",
                Prealloc {
                    count: 2,
                    size: 1 << 20,
                },
            ),
            64 << 20,
            FaultyChannel::new(uds("denoiser"), plan(4)),
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    den.wait_registered(5 * SECOND).unwrap();

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (delivered, outcomes) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Some(d) = den.recv(Duration::from_millis(50)) else {
                    continue;
                };
                let seed: u8 = d.id()[2..].parse::<u32>().unwrap() as u8;
                for (k, t) in d.tensors().enumerate() {
                    assert_eq!(
                        t.bytes,
                        pattern(seed.wrapping_add(k as u8), t.bytes.len()),
                        "{}",
                        d.id()
                    );
                }
                seen.push(d.id().to_owned());
                d.release();
            }
            seen
        });
        let mut outcomes = Vec::new();
        for wave in 0..25u32 {
            for i in 0..8 {
                let n = wave * 8 + i;
                send(&enc, &format!("f-{n}"), n as u8);
            }
            for _ in 0..8 {
                // Every request ends within the sender's staged timeout.
                let o = enc.next_outcome(6 * SECOND).expect("every request ends");
                outcomes.push(o);
            }
        }
        // Late and delayed messages still arrive; keep receiving until
        // quarantines and late waits are over.
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        (receiver.join().unwrap(), outcomes)
    });
    assert_eq!(outcomes.len(), 200);
    let sent = outcomes.iter().filter(|o| o.sent).count();
    // Faults took some, and most got through.
    assert!((100..200).contains(&sent), "{sent} of 200 sent");
    // Nothing was delivered twice, and nothing unsent was delivered.
    let mut unique = delivered.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), delivered.len());
    for id in &delivered {
        let o = outcomes.iter().find(|o| o.id.as_str() == id).unwrap();
        assert!(o.sent, "{id} delivered but reported unsent");
    }
    // Nothing is held anywhere any more.
    assert_idle(&enc);
    assert_idle(&den);
    for _ in 0..300 {
        let snap = coord.snapshot();
        if snap.in_flight == 0 && snap.prealloc_taken == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("coordinator still holds transfers: {:?}", coord.snapshot());
}

/// Where completions do not mean delivery, a receiver takes a transfer only
/// once its write is reported landed; one whose notice never comes is
/// refused after the landing timeout, and nothing stays held.
#[test]
fn a_transfer_whose_write_never_lands_is_refused_and_freed() {
    use tensorferry::fault::{FaultPlan, FaultyTransport, Notices};

    let coord = coordinator(&["encoder", "denoiser"]);
    // The encoder's transport posts a notice for each write that
    // completed, and loses half of them; the denoiser's reports them.
    let notices = Notices::default();
    let sender_notices = notices.clone();
    let enc = DataPlane::default()
        .start_instance_with(
            &InstanceNodeConfig::new("encoder", coord.endpoint()),
            64 << 20,
            UdsChannel::bind(&endpoint("encoder")).unwrap(),
            |t| {
                let plan = FaultPlan {
                    lose_notice: 0.5,
                    seed: 9,
                    ..FaultPlan::default()
                };
                FaultyTransport::with_notices(t, plan, sender_notices)
            },
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    let mut s = InstanceNodeConfig::new("denoiser", coord.endpoint());
    s.config.prealloc = Prealloc {
        count: 2,
        size: 1 << 20,
    };
    s.config.landing_timeout = Duration::from_millis(300);
    let den = DataPlane::default()
        .start_instance_with(
            &s,
            64 << 20,
            UdsChannel::bind(&endpoint("denoiser")).unwrap(),
            |t| FaultyTransport::with_notices(t, FaultPlan::default(), notices),
        )
        .unwrap();
    den.wait_registered(5 * SECOND).unwrap();
    let n = 24u32;
    let (mut delivered, mut refused) = (0, 0);
    for i in 0..n {
        let id = format!("n-{i}");
        send(&enc, &id, i as u8);
        let o = enc.next_outcome(5 * SECOND).expect("the write completes");
        assert!(o.sent, "the bytes were written");
        match den.recv(SECOND) {
            Some(d) => {
                assert_eq!(d.id(), id);
                for (k, t) in d.tensors().enumerate() {
                    assert_eq!(
                        t.bytes,
                        pattern((i as u8).wrapping_add(k as u8), t.bytes.len())
                    );
                }
                d.release();
                delivered += 1;
            }
            None => refused += 1,
        }
    }
    assert!(
        delivered > 0 && refused > 0,
        "{delivered} delivered, {refused} refused"
    );
    for _ in 0..300 {
        let snap = coord.snapshot();
        if snap.stats.delivered == delivered && snap.stats.failed == refused && snap.in_flight == 0
        {
            assert_idle(&enc);
            assert_idle(&den);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "{delivered} delivered, {refused} refused: {:?}",
        coord.snapshot()
    );
}

#[test]
fn the_in_process_channel_carries_a_hand_off() {
    use tensorferry_shm::{MemChannel, MemHub};

    let hub = MemHub::new();
    let _coordinator = CoordinatorNode::start(
        &CoordinatorNodeConfig::new(&["encoder", "denoiser"]),
        MemChannel::bind(&hub, "coordinator").unwrap(),
        |_| {},
    )
    .unwrap();
    let node = |role: &str| {
        let h = hub.clone();
        let name = format!("mem-{role}");
        DataPlane::default()
            .start_instance(
                &InstanceNodeConfig::new(role, "coordinator"),
                16 << 20,
                MemChannel::bind(&h, &name).unwrap(),
            )
            .unwrap()
    };
    let (enc, den) = (node("encoder"), node("denoiser"));
    enc.wait_registered(5 * SECOND).unwrap();
    den.wait_registered(5 * SECOND).unwrap();
    send(&enc, "m1", 5);
    check(&den, "m1", 5);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
}

/// The runtime over the verbs transport, with the NIC replaced by the
/// software stand-in: the connection exchange over the real side channel,
/// chunked RDMA writes within the window, completions raised on the wake
/// descriptor and reaped by the runtime's progress thread; every byte
/// checked. (Feature `verbs-sim`, which `scripts/test` turns on.)
#[cfg(feature = "verbs-sim")]
#[test]
fn the_runtime_hands_off_over_the_verbs_transport_on_a_stand_in_device() {
    use tensorferry_verbs::sim::SimDevice;
    use tensorferry_verbs::{VerbsConfig, VerbsTransport};

    let coord = coordinator(&["encoder", "denoiser"]);
    let node = |role: &str, prealloc: Prealloc| {
        // Small messages and a small window, so writes are chunked and
        // the window fills.
        let mut config = VerbsConfig::new("sim");
        config.send_depth = 8;
        let device = SimDevice::new([127, 0, 0, 1], 4096);
        let transport = VerbsTransport::with_device_and_pool(device, &config, 16 << 20).unwrap();
        let mut s = InstanceNodeConfig::new(role, coord.endpoint());
        s.config.prealloc = prealloc;
        let ch = UdsChannel::bind(&endpoint(role)).unwrap();
        let n = InstanceNode::start(&s, transport, ch).unwrap();
        n.wait_registered(5 * SECOND).unwrap();
        n
    };
    let enc = node("encoder", Prealloc::NONE);
    let den = node(
        "denoiser",
        Prealloc {
            count: 2,
            size: 1 << 20,
        },
    );
    for round in 0..10u8 {
        for i in 0..4u8 {
            send(
                &enc,
                &format!("v{round}-{i}"),
                round.wrapping_mul(5).wrapping_add(i),
            );
        }
        for i in 0..4u8 {
            check(
                &den,
                &format!("v{round}-{i}"),
                round.wrapping_mul(5).wrapping_add(i),
            );
        }
        for _ in 0..4 {
            assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
        }
    }
    assert_idle(&enc);
    assert_idle(&den);
    wait_delivered(&coord, 40);
    assert_eq!(enc.stats().metrics.bytes_written, 40 * 25_600);
    drop((enc, den));
}

/// A gate on a channel's sends: shut, a send waits at it, as a send to a
/// coordinator that stopped reading waits for ZeroMQ's send timeout.
#[derive(Default)]
struct Gate {
    /// Shut or not, and how many sends wait at it.
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, usize)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_shut(&self, shut: bool) {
        self.lock().0 = shut;
        self.changed.notify_all();
    }

    fn pass(&self) {
        let mut g = self.lock();
        g.1 += 1;
        self.changed.notify_all();
        while g.0 {
            g = self.changed.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.1 -= 1;
    }

    /// True once a send waits at the gate, within `patience`.
    fn has_a_send_waiting(&self, patience: Duration) -> bool {
        let g = self.lock();
        let (g, _) = self
            .changed
            .wait_timeout_while(g, patience, |g| g.1 == 0)
            .unwrap_or_else(PoisonError::into_inner);
        g.1 > 0
    }
}

/// Opens the gate when dropped, a failed assertion's unwinding included,
/// so that the sends waiting at it end.
struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_shut(false);
    }
}

/// A control channel's sending side behind a [`Gate`].
struct Gated<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S: ControlSend> ControlSend for Gated<S> {
    type Error = S::Error;

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), S::Error> {
        self.gate.pass();
        self.inner.send(to, parts)
    }
}

#[test]
fn a_control_send_that_blocks_holds_up_no_other_threads_call() {
    let coord = coordinator(&["encoder", "decoder"]);
    let dec = instance("decoder", &coord, Prealloc::NONE);
    let gate = Arc::new(Gate::default());
    let (tx, rx) = UdsChannel::bind(&endpoint("encoder")).unwrap().split();
    let gated = Gated {
        inner: tx,
        gate: Arc::clone(&gate),
    };
    let enc = DataPlane::default()
        .start_instance(
            &InstanceNodeConfig::new("encoder", coord.endpoint()),
            64 << 20,
            (gated, rx),
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    let enc = &enc;
    std::thread::scope(|s| {
        let open = OpenOnDrop(&gate);
        gate.set_shut(true);
        // This thread's commit sends `transfer_staged`, which waits at the
        // gate.
        let first = s.spawn(move || send(enc, "r1", 1));
        assert!(
            gate.has_a_send_waiting(30 * SECOND),
            "no send reached the gate"
        );
        // Meanwhile another thread's calls take the node's state: its
        // figures, and a request of its own staged, filled and committed.
        let (returned, calls) = mpsc::channel();
        s.spawn(move || {
            let _ = enc.stats();
            send(enc, "r2", 2);
            let _ = returned.send(());
        });
        assert!(
            calls.recv_timeout(30 * SECOND).is_ok(),
            "stats() and another request's commit waited for a blocked send"
        );
        drop(open);
        first.join().unwrap();
    });
    // With the gate open, both requests went out, and both hand-offs end
    // with every byte in place.
    let mut got = Vec::new();
    for _ in 0..2 {
        let d = dec.recv(5 * SECOND).expect("a delivery");
        let seed = match d.id() {
            "r1" => 1,
            "r2" => 2,
            other => panic!("unexpected request {other}"),
        };
        check_bytes(&d, seed);
        got.push(d.id().to_owned());
        d.release();
    }
    got.sort();
    assert_eq!(got, ["r1", "r2"]);
    for _ in 0..2 {
        assert!(enc.next_outcome(5 * SECOND).expect("an outcome").sent);
    }
}
