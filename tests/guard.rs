//! The runtime behind CurveZMQ: a coordinator and instances as threads of
//! this process over real ZeroMQ sockets on loopback TCP, every endpoint
//! a CURVE server admitting only its peers' keys; strangers with ZeroMQ
//! contexts of their own (no key, or a key nobody admitted) at every
//! endpoint the nodes bind, the verbs side channel included.

#[path = "common/client.rs"]
mod client;
#[path = "common/tensors.rs"]
mod tensors;

use std::time::Duration;

use client::guard;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNode, InstanceNodeConfig, Prealloc,
};
use tensorferry_zmq::{zmq, CurveKeyPair, Guard, ZmqChannel, ZmqConfig};

const SECOND: Duration = Duration::from_secs(1);
const MAGIC: &[u8] = b"__transfer__";

fn channel(guard: &Guard, endpoints: &[&str]) -> ZmqChannel {
    ZmqChannel::bind_guarded(&zmq::Context::new(), endpoints, ZmqConfig::default(), guard).unwrap()
}

struct Keys {
    coordinator: CurveKeyPair,
    encoder: CurveKeyPair,
    denoiser: CurveKeyPair,
}

fn keys() -> Keys {
    let [coordinator, encoder, denoiser] = [(); 3].map(|()| CurveKeyPair::generate().unwrap());
    Keys {
        coordinator,
        encoder,
        denoiser,
    }
}

/// A coordinator and its result endpoints (one per role).
fn coordinator(k: &Keys) -> (CoordinatorNode, Vec<String>) {
    let ch = channel(
        &guard(&k.coordinator, &[&k.encoder, &k.denoiser]),
        &["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"],
    );
    let mut settings = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    settings.result_endpoints = ch.endpoints();
    let node = CoordinatorNode::start(&settings, ch, |_| {}).unwrap();
    (node, settings.result_endpoints)
}

fn settings(role: &str, results: &[String]) -> InstanceNodeConfig {
    // Each role reports to its own result endpoint.
    let at = usize::from(role == "denoiser");
    let mut s = InstanceNodeConfig::new(role, &results[at]);
    if role == "denoiser" {
        s.config.prealloc = Prealloc {
            count: 2,
            size: 1 << 20,
        };
    }
    s
}

/// Stages request `id`, one tensor of 40,000 bytes from `seed`.
fn send(node: &InstanceNode, id: &str, seed: u8) {
    tensors::stage_bytes(node, id, "latents", 40_000, |i| {
        (i as u8).wrapping_mul(31).wrapping_add(seed)
    });
}

fn check(node: &InstanceNode, id: &str, seed: u8) {
    let d = node.recv(10 * SECOND).expect("a delivery");
    assert_eq!(d.id(), id);
    let t = d.tensors().next().unwrap();
    for (i, b) in t.bytes.iter().enumerate() {
        assert_eq!(
            *b,
            (i as u8).wrapping_mul(31).wrapping_add(seed),
            "{id} byte {i}"
        );
    }
    d.release();
}

/// From a thread with a ZeroMQ context of its own: a PUSH socket to
/// `endpoint` (a CURVE client with `key` if given, knowing `server`) that
/// sends forged messages for a second; how many it queued.
fn forge(endpoint: &str, key: Option<(&CurveKeyPair, &CurveKeyPair)>) -> usize {
    let endpoint = endpoint.to_owned();
    let key = key.map(|(mine, server)| (mine.clone(), *server.public()));
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = client::connect(&ctx, zmq::PUSH, &endpoint, key, 0);
        let mut sent = 0;
        let start = std::time::Instant::now();
        while start.elapsed() < SECOND {
            for msg in [
                r#"{"msg_type":"transfer_alloc","request_id":"ghost","data_size":1048576,"source_role":"encoder"}"#,
                r#"{"msg_type":"transfer_ready","request_id":"r-0","slot_offset":0,"manifest":{}}"#,
                r#"{"msg_type":"transfer_done","request_id":"r-0"}"#,
                "{not json",
            ] {
                if s.send_multipart([MAGIC, msg.as_bytes()], zmq::DONTWAIT).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    })
    .join()
    .unwrap()
}

/// What the nodes ignored so far: the coordinator, then each instance (a
/// registration resent while its answer was on its way is ignored as a
/// duplicate, so the tests compare with what was counted before the
/// strangers came).
fn ignored(coord: &CoordinatorNode, nodes: &[&InstanceNode]) -> Vec<u64> {
    std::iter::once(coord.snapshot().metrics.ignored)
        .chain(nodes.iter().map(|n| n.stats().metrics.ignored))
        .collect()
}

/// Checks that no node saw a stranger's message: nothing more ignored
/// than `before`, and no malformed frame (the strangers send some among
/// their forgeries; a connection is refused whole).
fn assert_saw_nothing(coord: &CoordinatorNode, nodes: &[&InstanceNode], before: &[u64]) {
    assert_eq!(ignored(coord, nodes), before, "{:?}", coord.snapshot());
    for n in nodes {
        let s = n.stats();
        assert_eq!(s.metrics.bad_frames, 0, "{s:?}");
    }
}

/// An encoder and a denoiser on shared memory, each a CURVE server with
/// its own key admitting the coordinator's, registered.
fn instances(k: &Keys, results: &[String]) -> (InstanceNode, InstanceNode) {
    let start = |role: &str, key: &CurveKeyPair| {
        let ch = channel(&guard(key, &[&k.coordinator]), &["tcp://127.0.0.1:*"]);
        let node = DataPlane::default()
            .start_instance(&settings(role, results), 16 << 20, ch)
            .unwrap();
        node.wait_registered(10 * SECOND).unwrap();
        node
    };
    (start("encoder", &k.encoder), start("denoiser", &k.denoiser))
}

#[test]
fn instances_hand_off_over_curve_and_strangers_reach_no_endpoint() {
    let k = keys();
    let (coord, results) = coordinator(&k);
    let (enc, den) = instances(&k, &results);
    let before = ignored(&coord, &[&enc, &den]);
    let stranger = CurveKeyPair::generate().unwrap();
    let mut targets: Vec<(String, &CurveKeyPair)> = results
        .iter()
        .map(|e| (e.clone(), &k.coordinator))
        .collect();
    targets.push((enc.endpoint().to_owned(), &k.encoder));
    targets.push((den.endpoint().to_owned(), &k.denoiser));
    for (ep, server) in &targets {
        assert!(forge(ep, None) > 0);
        assert!(forge(ep, Some((&stranger, server))) > 0);
    }
    for i in 0..20u8 {
        send(&enc, &format!("r-{i}"), i);
        check(&den, &format!("r-{i}"), i);
        assert!(enc.next_outcome(10 * SECOND).unwrap().sent);
    }
    assert_saw_nothing(&coord, &[&enc, &den], &before);
}

/// An admitted instance speaking for another: the encoder's key, from a
/// socket of its own, tells the coordinator that the denoiser leaves. The
/// coordinator took the denoiser's registration on the denoiser's key and
/// takes its messages only from that key: the forgery is ignored, the
/// denoiser stays, and hand-offs go on.
#[test]
fn an_admitted_instance_cannot_speak_for_another() {
    let k = keys();
    let (coord, results) = coordinator(&k);
    let (enc, den) = instances(&k, &results);
    assert_eq!(coord.snapshot().members, 2);
    let ignored_before = coord.snapshot().metrics.ignored;
    let leave = format!(
        r#"{{"msg_type":"transfer_deregister","session_id":"{}","draining":false,"reason":"forged"}}"#,
        den.session_id()
    );
    let ctx = zmq::Context::new();
    for ep in &results {
        let s = client::connect(
            &ctx,
            zmq::PUSH,
            ep,
            Some((k.encoder.clone(), *k.coordinator.public())),
            1000,
        );
        s.send_multipart([MAGIC, leave.as_bytes()], 0).unwrap();
    }
    // Both forgeries arrive (the key is admitted): ignored, or acted on.
    let deadline = std::time::Instant::now() + 10 * SECOND;
    loop {
        let now = coord.snapshot();
        assert_eq!(now.members, 2, "the denoiser stays: {now:?}");
        if now.metrics.ignored >= ignored_before + 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the forgeries never reached the coordinator: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for i in 0..5u8 {
        send(&enc, &format!("r-{i}"), i);
        check(&den, &format!("r-{i}"), i);
        assert!(enc.next_outcome(10 * SECOND).unwrap().sent);
    }
}

/// The verbs data plane on its stand-in device under CURVE: each side
/// channel a CURVE server whose key travels in the session id, admitting
/// the writers named; a stranger's connection request gets no answer.
#[cfg(feature = "verbs-sim")]
#[test]
fn the_verbs_side_channel_answers_admitted_writers_only() {
    use tensorferry_verbs::sim::SimDevice;
    use tensorferry_verbs::{Session, VerbsConfig, VerbsTransport};

    let k = keys();
    let (coord, results) = coordinator(&k);
    let start = |role: &str, key: &CurveKeyPair, writers: &[&CurveKeyPair]| {
        let g = guard(key, &[&k.coordinator]);
        let mut plane = DataPlane::Verbs(VerbsConfig::new("sim"));
        plane.guard(&g);
        let DataPlane::Verbs(mut config) = plane else {
            unreachable!()
        };
        config.writers = writers.iter().map(|w| *w.public()).collect();
        let device = SimDevice::new([127, 0, 0, 1], 4096);
        let transport = VerbsTransport::with_device_and_pool(device, &config, 16 << 20).unwrap();
        let ch = channel(&g, &["tcp://127.0.0.1:*"]);
        let node = InstanceNode::start(&settings(role, &results), transport, ch).unwrap();
        node.wait_registered(10 * SECOND).unwrap();
        node
    };
    let enc = start("encoder", &k.encoder, &[]);
    let den = start("denoiser", &k.denoiser, &[&k.encoder]);
    let before = ignored(&coord, &[&enc, &den]);
    let side = Session::parse(den.session_id()).unwrap();
    assert_eq!(side.key, Some(*k.denoiser.public()));
    // A stranger at the side channel, from an allowed address, without a
    // key and with one nobody admitted: no answer.
    let stranger = CurveKeyPair::generate().unwrap();
    for key in [None, Some(&stranger)] {
        let endpoint = side.endpoint.clone();
        let key = key.map(|s| (s.clone(), *k.denoiser.public()));
        let answered = std::thread::spawn(move || {
            let ctx = zmq::Context::new();
            let s = client::connect(&ctx, zmq::DEALER, &endpoint, key, 0);
            s.send(&br#"{"v":2,"from":"x","to":"0","qp":{}}"#[..], 0)
                .unwrap();
            s.poll(zmq::POLLIN, 1000).unwrap() > 0
        })
        .join()
        .unwrap();
        assert!(!answered, "the side channel answered a stranger");
    }
    for i in 0..10u8 {
        send(&enc, &format!("v-{i}"), i);
        check(&den, &format!("v-{i}"), i);
        assert!(enc.next_outcome(10 * SECOND).unwrap().sent);
    }
    assert_saw_nothing(&coord, &[&enc, &den], &before);
}
