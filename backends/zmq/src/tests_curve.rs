//! The guard with CURVE end to end over loopback TCP and IPC sockets: a
//! coordinator's channel and an instance's, strangers with no key and with
//! a key nobody admitted, and keys from certificates in pyzmq's format.

use std::time::Duration;

use tensorferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend};

use crate::{
    zmq, CurveConfig, CurveKeyPair, Guard, ZmqChannel, ZmqConfig, ZmqError, ZmqReceiver, ZmqSender,
};

const MAGIC: &[u8] = b"__transfer__";

fn curve(key: &CurveKeyPair, peers: &[&CurveKeyPair]) -> Guard {
    Guard {
        allow: vec!["127.0.0.1".parse().unwrap()],
        curve: Some(CurveConfig {
            key: key.clone(),
            peers: peers.iter().map(|p| *p.public()).collect(),
        }),
    }
}

fn bind(ctx: &zmq::Context, ep: &str, guard: &Guard) -> (ZmqSender, ZmqReceiver, String) {
    let ch = ZmqChannel::bind_guarded(ctx, &[ep], ZmqConfig::default(), guard).unwrap();
    let bound = ch.endpoints()[0].clone();
    let (tx, rx) = ch.split();
    (tx, rx, bound)
}

/// Every message that arrives within `rounds` × 50 ms.
fn drain(rx: &mut ZmqReceiver, rounds: usize) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    for _ in 0..rounds {
        if let Ok(Some(ChannelEvent::Message(m))) =
            rx.recv(&mut buf, Duration::from_millis(50), None)
        {
            got.push(m.payload.to_vec());
        }
    }
    got
}

fn next(rx: &mut ZmqReceiver) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    for _ in 0..200 {
        match rx.recv(&mut buf, Duration::from_millis(50), None) {
            Ok(Some(ChannelEvent::Message(m))) => return m.payload.to_vec(),
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    panic!("nothing arrived");
}

fn register(work_endpoint: &str) -> Vec<u8> {
    format!(
        r#"{{"msg_type":"transfer_register","role":"encoder","session_id":"s","pool_ptr":0,"pool_size":0,"work_endpoint":"{work_endpoint}","preallocated_slots":[]}}"#
    )
    .into_bytes()
}

/// A raw PUSH socket of a context of its own: a stranger's, with `key`
/// (and the server's key) or none, that sends registrations naming
/// `naming` and forged messages.
fn stranger(
    to: &str,
    key: Option<(&CurveKeyPair, &CurveKeyPair)>,
    naming: &str,
) -> (zmq::Context, zmq::Socket) {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::PUSH).unwrap();
    s.set_linger(0).unwrap();
    if let Some((mine, server)) = key {
        s.set_curve_serverkey(&server.public().0).unwrap();
        s.set_curve_publickey(&mine.public().0).unwrap();
        s.set_curve_secretkey(mine.secret()).unwrap();
    }
    s.connect(to).unwrap();
    for _ in 0..20 {
        let _ = s.send_multipart([MAGIC, &register(naming)[..]], zmq::DONTWAIT);
        let _ = s.send_multipart([MAGIC, b"forged"], zmq::DONTWAIT);
    }
    (ctx, s)
}

#[test]
fn a_coordinator_and_its_instance_talk_over_curve_and_strangers_get_nothing_through() {
    let [kc, ki, kj, kx] = [(); 4].map(|()| CurveKeyPair::generate().unwrap());
    let c_ctx = zmq::Context::new();
    // Two instances admitted: neither key is the coordinator's to assume.
    let (mut c_tx, mut c_rx, c_ep) = bind(&c_ctx, "tcp://127.0.0.1:*", &curve(&kc, &[&ki, &kj]));
    let i_ctx = zmq::Context::new();
    let (mut i_tx, mut i_rx, i_ep) = bind(&i_ctx, "tcp://127.0.0.1:*", &curve(&ki, &[&kc]));

    // Before the instance registered, the coordinator knows no key for it.
    let e = c_tx.send(&i_ep, &[MAGIC, b"early"]).unwrap_err();
    assert!(matches!(e, ZmqError::NoServerKey { .. }), "{e}");

    // The instance reaches the coordinator with the coordinator's key (its
    // only peer); the registration teaches the coordinator the instance's.
    i_tx.send(&c_ep, &[MAGIC, &register(&i_ep)]).unwrap();
    assert_eq!(next(&mut c_rx), register(&i_ep));
    c_tx.send(&i_ep, &[MAGIC, b"ack"]).unwrap();
    assert_eq!(next(&mut i_rx), b"ack");

    // Strangers from an allowed address: with no key (refused at the
    // greeting), and with a key nobody admitted (refused by the handler).
    let before = (c_rx.refused(), i_rx.refused());
    let keyless = [stranger(&c_ep, None, &i_ep), stranger(&i_ep, None, &i_ep)];
    let unlisted = [
        stranger(&c_ep, Some((&kx, &kc)), &i_ep),
        stranger(&i_ep, Some((&kx, &ki)), &i_ep),
    ];
    assert_eq!(drain(&mut c_rx, 20), Vec::<Vec<u8>>::new());
    assert_eq!(drain(&mut i_rx, 20), Vec::<Vec<u8>>::new());
    assert!(
        c_rx.refused() > before.0,
        "the coordinator's handler refused nothing"
    );
    assert!(
        i_rx.refused() > before.1,
        "the instance's handler refused nothing"
    );
    drop((keyless, unlisted));

    // A stranger's registration naming the instance taught nothing: the
    // coordinator still reaches it.
    c_tx.send(&i_ep, &[MAGIC, b"still"]).unwrap();
    assert_eq!(next(&mut i_rx), b"still");
}

#[test]
fn a_peer_back_with_a_new_key_at_the_same_endpoint_is_reached_with_it() {
    let (kc, k1, k2) = (
        CurveKeyPair::generate().unwrap(),
        CurveKeyPair::generate().unwrap(),
        CurveKeyPair::generate().unwrap(),
    );
    let c_ctx = zmq::Context::new();
    let (mut c_tx, mut c_rx, c_ep) = bind(&c_ctx, "tcp://127.0.0.1:*", &curve(&kc, &[&k1, &k2]));
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ep = format!("tcp://127.0.0.1:{port}");
    for (round, key) in [&k1, &k2].into_iter().enumerate() {
        let ctx = zmq::Context::new();
        let (mut tx, mut rx, _) = bind(&ctx, &ep, &curve(key, &[&kc]));
        tx.send(&c_ep, &[MAGIC, &register(&ep)]).unwrap();
        assert_eq!(next(&mut c_rx), register(&ep));
        let hello = format!("hello {round}");
        c_tx.send(&ep, &[MAGIC, hello.as_bytes()]).unwrap();
        assert_eq!(next(&mut rx), hello.as_bytes());
    }
}

#[test]
fn ipc_endpoints_take_curve_too() {
    let (kc, ki) = (
        CurveKeyPair::generate().unwrap(),
        CurveKeyPair::generate().unwrap(),
    );
    let dir = std::env::temp_dir();
    let pid = std::process::id();
    let c_ep = format!("ipc://{}/ferry-zmq-curve-c-{pid}.sock", dir.display());
    let i_ep = format!("ipc://{}/ferry-zmq-curve-i-{pid}.sock", dir.display());
    let c_ctx = zmq::Context::new();
    let (mut c_tx, mut c_rx, _) = bind(&c_ctx, &c_ep, &curve(&kc, &[&ki]));
    let i_ctx = zmq::Context::new();
    let (mut i_tx, mut i_rx, _) = bind(&i_ctx, &i_ep, &curve(&ki, &[&kc]));
    i_tx.send(&c_ep, &[MAGIC, &register(&i_ep)]).unwrap();
    assert_eq!(next(&mut c_rx), register(&i_ep));
    c_tx.send(&i_ep, &[MAGIC, b"ack"]).unwrap();
    assert_eq!(next(&mut i_rx), b"ack");
    let keyless = stranger(&i_ep, None, &i_ep);
    assert_eq!(drain(&mut i_rx, 20), Vec::<Vec<u8>>::new());
    drop(keyless);
}

/// Keys from a certificate pyzmq wrote (`zmq.auth.create_certificates`)
/// work in a real handshake: the server holds the secret file's pair, the
/// client knows the public key.
#[test]
fn a_key_pair_from_a_pyzmq_certificate_serves_a_curve_handshake() {
    let dir = std::env::temp_dir().join(format!("ferry-zmq-pyzmq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("server.key_secret");
    let public = dir.join("server.key");
    std::fs::write(
        &secret,
        "#   ****  Generated on 2026-12-02 16:56:14.925642 by pyzmq  ****\n\
         #   ZeroMQ CURVE **Secret** Certificate\n\
         #   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n\
         metadata\ncurve\n\
         \x20   public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E\"\n\
         \x20   secret-key = \"C(*tf)M?hE<1Vo.7AiKeM}:6CC7v+Ev]7::%6i(F\"\n",
    )
    .unwrap();
    std::fs::write(
        &public,
        "metadata\ncurve\n    public-key = \"5js?Zl-W*S=wDAc1pNLXP3L5b4Ro2B7GK#bla7?E\"\n",
    )
    .unwrap();
    let client = CurveKeyPair::generate().unwrap();
    let client_dir = dir.join("clients");
    crate::write_certificates(&client_dir, "client", &client).unwrap();
    // pyzmq writes it with the process's umask: as written, others may
    // read it, and it is refused until it is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = CurveConfig::load(&secret, &client_dir).unwrap_err();
    assert!(refused.why.contains("chmod 600"), "{refused}");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = CurveConfig::load(&secret, &client_dir).unwrap();
    assert_eq!(server.peers, vec![*client.public()]);
    let ctx = zmq::Context::new();
    let guard = Guard {
        allow: Vec::new(),
        curve: Some(server),
    };
    let (_tx, mut rx, ep) = bind(&ctx, "tcp://127.0.0.1:*", &guard);
    let server_public = crate::read_public_key(&public).unwrap();
    let c_ctx = zmq::Context::new();
    let s = c_ctx.socket(zmq::PUSH).unwrap();
    s.set_linger(0).unwrap();
    s.set_curve_serverkey(&server_public.0).unwrap();
    s.set_curve_publickey(&client.public().0).unwrap();
    s.set_curve_secretkey(client.secret()).unwrap();
    s.connect(&ep).unwrap();
    s.send_multipart([MAGIC, b"through"], 0).unwrap();
    assert_eq!(next(&mut rx), b"through");
    std::fs::remove_dir_all(&dir).unwrap();
}
