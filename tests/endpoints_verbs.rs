//! The verbs data plane's endpoints on its stand-in device, which lives
//! inside one process: a coordinator, an encoder and a denoiser, and two
//! transfer engines, all of this test's process (its own binary, so that
//! nothing else listens in it). Every socket it listens on is one the
//! book's endpoint table names (docs/src/operating.md, "Endpoints the
//! processes open"): the coordinator's result endpoints, the instances'
//! work endpoints and side channels, the engines' inboxes and side
//! channels. At each side channel and inbox a stranger (no key; a key
//! nobody admitted; an admitted key from an address outside the
//! allow-list) is refused: no queue pair is made, no notification is
//! delivered, and the hand-offs and transfers all complete byte-exact.
#![cfg(feature = "verbs-sim")]

#[path = "common/client.rs"]
mod client;
#[path = "common/listeners.rs"]
mod listeners;
#[path = "common/stranger.rs"]
mod stranger;
#[path = "common/tensors.rs"]
mod tensors;

use std::path::Path;
use std::time::Duration;

use client::guard;
use stranger::notify_as;
use tensorferry::engine::{EngineConfig, Op, TransferEngine};
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNode, InstanceNodeConfig, Prealloc,
};
use tensorferry_verbs::sim::SimDevice;
use tensorferry_verbs::{Session, VerbsConfig, VerbsTransport};
use tensorferry_zmq::{zmq, CurveKeyPair, Guard, ZmqChannel, ZmqConfig};

const SECOND: Duration = Duration::from_secs(1);

/// The port of a `tcp://host:port` endpoint.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

/// A DEALER to `endpoint`, from `source` (an address of this host), with
/// `key` (a CURVE client knowing `server`) if given, sends a connection
/// request (or anything); true if anything came back within a second.
fn answered(
    endpoint: &str,
    source: &str,
    key: Option<(CurveKeyPair, tensorferry_zmq::CurvePublicKey)>,
    message: &[u8],
) -> bool {
    let to = format!("tcp://{source}:0;{}", endpoint.trim_start_matches("tcp://"));
    let message = message.to_vec();
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = client::connect(&ctx, zmq::DEALER, &to, key, 0);
        s.send(&message[..], 0).unwrap();
        s.poll(zmq::POLLIN, 1000).unwrap() > 0
    })
    .join()
    .unwrap()
}

/// An engine on the stand-in device under `g`, as `TransferEngine::open`
/// sets one up on a real device (`VerbsConfig::take_engine_guard`).
fn engine(g: &Guard) -> TransferEngine {
    let mut c = VerbsConfig::new("sim");
    c.listen = Some("127.0.0.1".into());
    c.take_engine_guard(g);
    let t = VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).unwrap();
    let mut options = EngineConfig::default();
    options.guard = Some(g.clone());
    TransferEngine::over(t, "verbs", options).unwrap()
}

#[test]
fn over_the_verbs_stand_in_strangers_are_refused_at_every_endpoint_the_book_names() {
    let book = listeners::book(Path::new(env!("CARGO_MANIFEST_DIR")));
    let [coordinator, encoder, denoiser, a_key, b_key, other] =
        [(); 6].map(|()| CurveKeyPair::generate().unwrap());

    // A coordinator, an encoder and a denoiser on the stand-in.
    let cg = guard(&coordinator, &[&encoder, &denoiser]);
    let ch = ZmqChannel::bind_guarded(
        &zmq::Context::new(),
        &["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"],
        ZmqConfig::default(),
        &cg,
    )
    .unwrap();
    let mut settings = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    settings.result_endpoints = ch.endpoints();
    let results = settings.result_endpoints.clone();
    let coord = CoordinatorNode::start(&settings, ch, |_| {}).unwrap();
    let start = |role: &str, key: &CurveKeyPair, writers: &[&CurveKeyPair]| {
        let g = guard(key, &[&coordinator]);
        let mut plane = DataPlane::Verbs(VerbsConfig::new("sim"));
        plane.guard(&g);
        let DataPlane::Verbs(mut config) = plane else {
            unreachable!()
        };
        config.listen = Some("127.0.0.1".into());
        config.writers = writers.iter().map(|w| *w.public()).collect();
        let device = SimDevice::new([127, 0, 0, 1], 4096);
        let transport = VerbsTransport::with_device_and_pool(device, &config, 16 << 20).unwrap();
        let ch = ZmqChannel::bind_guarded(
            &zmq::Context::new(),
            &["tcp://127.0.0.1:*"],
            ZmqConfig::default(),
            &g,
        )
        .unwrap();
        let mut s = InstanceNodeConfig::new(role, &results[usize::from(role == "denoiser")]);
        if role == "denoiser" {
            s.config.prealloc = Prealloc {
                count: 2,
                size: 1 << 20,
            };
        }
        let node = InstanceNode::start(&s, transport, ch).unwrap();
        node.wait_registered(10 * SECOND).unwrap();
        node
    };
    let enc = start("encoder", &encoder, &[]);
    let den = start("denoiser", &denoiser, &[&encoder]);

    // Two engines on the stand-in, each admitting the other.
    let a = engine(&guard(&a_key, &[&b_key]));
    let b = engine(&guard(&b_key, &[&a_key]));

    // What this process listens on is what the book names.
    let mut known: Vec<(u16, &str, &str)> = results
        .iter()
        .map(|r| (port_of(r), "ferry coordinator", "result"))
        .collect();
    for node in [&enc, &den] {
        known.push((port_of(node.endpoint()), "ferry instance", "work"));
        let side = Session::parse(node.session_id()).unwrap();
        known.push((port_of(&side.endpoint), "ferry instance", "side"));
    }
    let mut names = Vec::new();
    for e in [&a, &b] {
        let sid = e.session_id();
        let (plane, inbox) = sid.rsplit_once('|').unwrap();
        known.push((port_of(inbox), "TransferEngine", "inbox"));
        let side = Session::parse(plane).unwrap();
        known.push((port_of(&side.endpoint), "TransferEngine", "side"));
        // `<key>@tcp://host:port`: the Unix name is the endpoint's.
        names.push(format!(
            "@tensorferry-notify/{}",
            &inbox[41 + "tcp://".len()..]
        ));
    }
    let (open, unix) = listeners::listening(std::process::id());
    let mut unix_seen = unix.clone();
    unix_seen.sort();
    names.sort();
    assert_eq!(unix_seen, names, "the Unix sockets this process listens on");
    assert!(book.contains(&("TransferEngine".to_owned(), "inbox-local".to_owned())));
    for addr in &open {
        let Some((_, process, endpoint)) = known.iter().find(|(p, ..)| *p == addr.port()) else {
            panic!("this process listens on {addr}, which the book's endpoint table does not name");
        };
        assert!(
            book.contains(&((*process).to_owned(), (*endpoint).to_owned())),
            "no `{endpoint}` row for `{process}` in the book"
        );
    }
    assert_eq!(open.len(), known.len(), "{open:?} vs {known:?}");

    // Strangers at every side channel: no key, a key nobody admitted (from
    // an allowed address), and an admitted key from outside the list.
    let request = br#"{"v":3,"from":"verbs:0000000000000001@tcp://127.0.0.1:1","to":"0","qp":{}}"#;
    let sides: Vec<(String, tensorferry_zmq::CurvePublicKey, CurveKeyPair)> = vec![
        (
            Session::parse(den.session_id()).unwrap().endpoint,
            *denoiser.public(),
            encoder.clone(),
        ),
        (
            Session::parse(a.session_id().rsplit_once('|').unwrap().0)
                .unwrap()
                .endpoint,
            *a_key.public(),
            b_key.clone(),
        ),
    ];
    for (endpoint, server, admitted) in &sides {
        assert!(!answered(endpoint, "127.0.0.1", None, request));
        assert!(!answered(
            endpoint,
            "127.0.0.1",
            Some((other.clone(), *server)),
            request
        ));
        assert!(!answered(
            endpoint,
            "127.0.0.2",
            Some((admitted.clone(), *server)),
            request
        ));
    }
    // Strangers at engine a's inbox, claiming to be b; and b's own key
    // claiming another engine's session (an admitted peer speaking for
    // another): none is delivered.
    let a_sid = a.session_id();
    let inbox = {
        // `<40-character key>@tcp://...` (Z85 has `@` among its letters).
        let part = a_sid.rsplit_once('|').unwrap().1;
        assert_eq!(&part[40..41], "@", "{part}");
        part[41..].to_owned()
    };
    let b_sid = b.session_id();
    notify_as(&inbox, "127.0.0.1", None, &b_sid, "done:forged");
    notify_as(
        &inbox,
        "127.0.0.1",
        Some((other.clone(), *a_key.public())),
        &b_sid,
        "done:forged",
    );
    notify_as(
        &inbox,
        "127.0.0.2",
        Some((b_key.clone(), *a_key.public())),
        &b_sid,
        "done:forged",
    );
    let someone_else = b_sid.replace(&b_key.public().to_z85(), &other.public().to_z85());
    notify_as(
        &inbox,
        "127.0.0.1",
        Some((b_key.clone(), *a_key.public())),
        &someone_else,
        "done:forged",
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        a.notifications().unwrap().is_empty(),
        "a stranger's notification arrived"
    );
    assert!(
        a.forged_notifications() > 0,
        "the forgery under b's key was seen and dropped"
    );

    // The peers go on: hand-offs between the instances, a transfer with a
    // notification between the engines, byte-exact.
    for i in 0..10u8 {
        let id = format!("v-{i}");
        tensors::stage_bytes(&enc, &id, "latents", 40_000, |_| i);
        let d = den.recv(10 * SECOND).expect("a delivery");
        assert_eq!(d.id(), id);
        assert!(d.tensors().next().unwrap().bytes.iter().all(|&b| b == i));
        d.release();
        assert!(enc.next_outcome(10 * SECOND).unwrap().sent);
    }
    let src = vec![7u8; 1 << 20];
    let dst = vec![0u8; 1 << 20];
    // SAFETY: both outlive the engines (dropped first, below), and `dst`
    // is read only once the transfer into it has returned.
    unsafe {
        a.register(src.as_ptr() as u64, src.len() as u64).unwrap();
        b.register(dst.as_ptr() as u64, dst.len() as u64).unwrap();
    }
    let op = Op {
        src: src.as_ptr() as u64,
        dst: dst.as_ptr() as u64,
        len: 1 << 20,
    };
    a.post_write(&b_sid, &[op], 10 * SECOND, Some(b"done:real"))
        .unwrap()
        .finish()
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(b.notifications().unwrap());
        if !got.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(got.len(), 1);
    // The sender's session id as it is now (registering memory moves a
    // verbs session's generation on).
    let a_now = a.session_id();
    assert_eq!(
        (got[0].from.as_str(), &got[0].message[..]),
        (&a_now[..], &b"done:real"[..])
    );
    assert!(dst.iter().all(|&x| x == 7));
    drop((a, b));
    let snap = coord.snapshot();
    assert_eq!(snap.metrics.ignored, 0, "{snap:?}");
    drop((enc, den, coord));
}
