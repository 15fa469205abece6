//! The side channel behind its guard, over the software stand-in: real
//! ZeroMQ sockets on loopback TCP, strangers with their own ZeroMQ
//! contexts, the real exchange; only the NIC is simulated. Also what it
//! binds a request to (the requester its connection proves) and bounds
//! (frame sizes, the queue pairs one requester may cost a target).

#![allow(unsafe_code)] // Registering test pools and reading them back.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{Region, Transport, WriteOp, WriteTag};
use tensorferry_hostmem::HostPool;
use tensorferry_zmq::{zmq, CurveKeyPair};

use crate::conn::Requester;
use crate::error::VerbsError;
use crate::exchange::{QpInfo, Reply, Request};
use crate::session::Session;
use crate::sim::SimDevice;
use crate::transport::{VerbsConfig, VerbsTransport};

struct Node {
    t: VerbsTransport<SimDevice>,
    pool: HostPool,
    region: Region,
}

fn config(key: Option<&CurveKeyPair>, writers: &[&CurveKeyPair]) -> VerbsConfig {
    let mut c = VerbsConfig::new("sim");
    c.write_timeout = Duration::from_millis(800);
    c.connect_timeout = Duration::from_millis(500);
    c.curve_key = key.cloned();
    c.writers = writers.iter().map(|w| *w.public()).collect();
    c
}

fn node(config: &VerbsConfig) -> Node {
    let device = SimDevice::new([127, 0, 0, 1], 4096);
    let mut t = VerbsTransport::with_device(device, config).expect("open over the stand-in");
    let pool = HostPool::new(1 << 16).expect("map a pool");
    // SAFETY: the pool outlives the registration (`t` drops first).
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.expect("register");
    Node { t, pool, region }
}

impl Node {
    fn bytes(&self) -> &[u8] {
        // SAFETY: read while no write into the pool is in flight.
        unsafe { std::slice::from_raw_parts(self.pool.ptr(), self.pool.len()) }
    }

    fn fill(&mut self, byte: u8) {
        // SAFETY: as above; `&mut self` keeps other views away.
        unsafe { std::ptr::write_bytes(self.pool.ptr(), byte, self.pool.len()) }
    }

    /// Writes 64 bytes to the start of `to`'s pool; the completion's result.
    fn write_to(&mut self, to: &Node, cookie: u64) -> Result<(), VerbsError> {
        self.t.post_write(&WriteOp {
            region: self.region,
            local_offset: 0,
            len: 64,
            dest_session: to.t.session_id(),
            dest_addr: to.region.addr,
            tag: WriteTag(cookie),
            cookie,
        })?;
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Some(c) = self.t.poll_completion() {
                assert_eq!(c.cookie, cookie);
                return c.result;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("no completion for write {cookie}");
    }

    fn qps_created(&self) -> u32 {
        self.t.with_device_mut(|d| d.qps_created)
    }
}

/// A valid connection request for `target`, as any writer would send it.
fn request_for(target: &Node) -> Vec<u8> {
    request_from(target, "verbs:00000000000000aa@tcp://127.0.0.1:9")
}

/// A valid connection request for `target` naming the writer session
/// `from`.
fn request_from(target: &Node, from: &str) -> Vec<u8> {
    let s = Session::parse(target.t.session_id()).unwrap();
    Request {
        from: from.into(),
        to: s.incarnation,
        qp: QpInfo {
            qpn: 77,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
            psn: 5,
            mtu: 1024,
            rd_atom: 16,
        },
    }
    .encode()
}

/// From a thread with a ZeroMQ context of its own: connects a DEALER to
/// `endpoint` (as a CURVE client with `key` and the server's key, if
/// given), sends `request` and returns the reply, if one comes within
/// two seconds.
fn stranger(
    endpoint: &str,
    key: Option<(CurveKeyPair, tensorferry_zmq::CurvePublicKey)>,
    request: Vec<u8>,
) -> Option<Vec<u8>> {
    let endpoint = endpoint.to_owned();
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::DEALER).unwrap();
        s.set_linger(0).unwrap();
        if let Some((mine, server)) = key {
            let guard = tensorferry_zmq::Guard {
                allow: Vec::new(),
                curve: Some(tensorferry_zmq::CurveConfig {
                    key: mine,
                    peers: Vec::new(),
                }),
            };
            guard.client(&s, &endpoint, Some(&server)).unwrap();
        }
        s.connect(&endpoint).unwrap();
        s.send(&request, 0).unwrap();
        match s.poll(zmq::POLLIN, 2000) {
            Ok(n) if n > 0 => s.recv_bytes(0).ok(),
            _ => None,
        }
    })
    .join()
    .unwrap()
}

#[test]
fn a_curve_side_channel_takes_admitted_writers_only() {
    let [kr, ka, kx] = [(); 3].map(|()| CurveKeyPair::generate().unwrap());
    let mut r = node(&config(Some(&kr), &[&ka]));
    let mut a = node(&config(Some(&ka), &[]));
    let mut x = node(&config(Some(&kx), &[]));
    let mut plain = node(&config(None, &[]));
    assert!(
        r.t.session_id().contains(&format!("+{}@", kr.public())),
        "{}",
        r.t.session_id()
    );
    r.fill(0);
    a.fill(0xa5);
    a.write_to(&r, 1).expect("an admitted writer writes");
    assert!(r.bytes()[..64].iter().all(|&b| b == 0xa5));
    assert_eq!(r.t.refused(), 0);

    // A key nobody admitted: refused by the handler, nothing written.
    x.fill(0x5a);
    let e = x.write_to(&r, 2).unwrap_err();
    assert!(matches!(e, VerbsError::ConnectTimeout { .. }), "{e}");
    assert!(r.t.refused() > 0, "the handler refused nothing");
    assert!(r.bytes()[..64].iter().all(|&b| b == 0xa5));

    // No key at all: this side says so at once.
    let e = plain.write_to(&r, 3).unwrap_err();
    assert!(e.to_string().contains("requires CURVE"), "{e}");
}

#[test]
fn a_stranger_without_a_key_is_refused_before_the_side_channel_reads_a_byte() {
    let [kr, ka] = [(); 2].map(|()| CurveKeyPair::generate().unwrap());
    let mut c = config(Some(&kr), &[&ka]);
    c.allow_from = vec!["127.0.0.1".parse().unwrap()];
    let r = node(&c);
    let endpoint = r.t.endpoint().to_owned();
    let made = r.qps_created();
    // A valid request naming the current incarnation, in the name of a
    // writer session of the admitted key.
    let request = request_from(&r, &session_of(&ka));
    // From 127.0.0.1, an allowed address: no reply, and no queue pair
    // made.
    assert_eq!(stranger(&endpoint, None, request.clone()), None);
    let kx = CurveKeyPair::generate().unwrap();
    assert_eq!(
        stranger(&endpoint, Some((kx, *kr.public())), request.clone()),
        None
    );
    assert_eq!(
        r.qps_created(),
        made,
        "the side channel acted on a stranger"
    );
    assert!(r.t.refused() > 0, "the handler refused nothing");
    // The same request from an admitted key is answered: it was valid.
    let reply = stranger(&endpoint, Some((ka, *kr.public())), request);
    assert!(reply.is_some_and(|r| r.windows(4).any(|w| w == b"\"qp\"")));
    assert_eq!(r.qps_created(), made + 1);
}

#[test]
fn the_allow_list_guards_a_plain_side_channel() {
    let mut c = config(None, &[]);
    c.allow_from = vec!["127.0.0.2".parse().unwrap()];
    let r = node(&c);
    let endpoint = r.t.endpoint().to_owned();
    let made = r.qps_created();
    assert_eq!(stranger(&endpoint, None, request_for(&r)), None);
    assert_eq!(r.qps_created(), made);
    assert!(r.t.refused() > 0);
    // From 127.0.0.2 (libzmq's `source;destination` form) it is answered.
    let from_listed = format!(
        "tcp://127.0.0.2:0;{}",
        endpoint.trim_start_matches("tcp://")
    );
    assert!(stranger(&from_listed, None, request_for(&r)).is_some());
    assert_eq!(r.qps_created(), made + 1);
}

#[test]
fn writers_without_a_key_of_its_own_are_refused_at_open() {
    let ka = CurveKeyPair::generate().unwrap();
    let e =
        VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &config(None, &[&ka]))
            .unwrap_err();
    assert!(e.to_string().contains("no key of this node's"), "{e}");
}

/// `endpoint` (`tcp://host:port`) as dialled from 127.0.0.2 (libzmq's
/// `source;destination` form): another address than the nodes' own, so
/// another requester on a side channel without CURVE.
fn from_other_address(endpoint: &str) -> String {
    format!(
        "tcp://127.0.0.2:0;{}",
        endpoint.trim_start_matches("tcp://")
    )
}

/// A writer session id carrying `key`'s public key, as a writer with that
/// key has.
fn session_of(key: &CurveKeyPair) -> String {
    Session {
        incarnation: 0xbb,
        generation: 0,
        endpoint: "tcp://127.0.0.1:9".into(),
        key: Some(*key.public()),
    }
    .to_string()
}

/// A reply's bytes, decoded.
fn reply(bytes: Option<Vec<u8>>) -> Reply {
    Reply::decode(&bytes.expect("a reply"), "the target").expect("a valid reply")
}

/// `request` padded with blanks to the largest exchange message.
fn padded(mut request: Vec<u8>) -> Vec<u8> {
    let pad = crate::exchange::MAX_MESSAGE - request.len();
    request.splice(1..1, vec![b' '; pad]);
    request
}

fn address(a: &str) -> Requester {
    Requester::Address(a.into())
}

#[test]
fn under_curve_an_admitted_peer_cannot_ask_in_another_writers_name() {
    let [kr, ka, kx] = [(); 3].map(|()| CurveKeyPair::generate().unwrap());
    let mut r = node(&config(Some(&kr), &[&ka, &kx]));
    let mut a = node(&config(Some(&ka), &[]));
    let endpoint = r.t.endpoint().to_owned();
    r.fill(0);
    a.fill(0xa5);
    a.write_to(&r, 1).expect("an admitted writer writes");
    let (r_made, a_made) = (r.qps_created(), a.qps_created());
    assert_eq!(r.t.accepted(), 1);
    // `x`, admitted under its own key, asks in `a`'s name (whose session id
    // carries `a`'s key), then in the name of a session with no key:
    // refused, counted, and no queue pair made or dropped.
    for (i, from) in [a.t.session_id(), "verbs:00000000000000aa@tcp://127.0.0.1:9"]
        .into_iter()
        .enumerate()
    {
        let got = stranger(
            &endpoint,
            Some((kx.clone(), *kr.public())),
            request_from(&r, from),
        );
        match reply(got) {
            Reply::Refuse { why } => assert!(why.contains("does not carry"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.t.forged_requests(), i as u64 + 1);
    }
    assert_eq!(r.qps_created(), r_made);
    assert_eq!(r.t.accepted(), 1);
    // `a`'s queue pair is the one it had: its next write goes over it.
    a.fill(0x3c);
    a.write_to(&r, 2).expect("the writer named still writes");
    assert!(r.bytes()[..64].iter().all(|&b| b == 0x3c));
    assert_eq!((r.qps_created(), a.qps_created()), (r_made, a_made));
    // In its own name (a session carrying its key) `x` is answered, with a
    // queue pair kept under its key; a request of the largest size passes
    // with CURVE's box around it.
    let own = session_of(&kx);
    let got = stranger(
        &endpoint,
        Some((kx.clone(), *kr.public())),
        padded(request_from(&r, &own)),
    );
    assert!(matches!(reply(got), Reply::Accept { .. }));
    assert_eq!(r.t.accepted_from(&Requester::Key(*kx.public())), 1);
    assert_eq!(r.t.accepted_from(&Requester::Key(*ka.public())), 1);
    assert_eq!(r.t.forged_requests(), 2);
}

#[test]
fn without_keys_a_request_from_another_address_never_replaces_a_writers_queue_pair() {
    let r = node(&config(None, &[]));
    let mut a = node(&config(None, &[]));
    let other = from_other_address(r.t.endpoint());
    a.write_to(&r, 1).expect("a writer writes");
    let (r_made, a_made) = (r.qps_created(), a.qps_created());
    // From 127.0.0.2, a request naming `a`'s session: answered with a queue
    // pair of that requester's own; `a`'s (from 127.0.0.1) stays.
    for round in 1..=2 {
        let got = stranger(&other, None, request_from(&r, a.t.session_id()));
        assert!(matches!(reply(got), Reply::Accept { .. }));
        // The second time it replaces the first: its own.
        assert_eq!(r.qps_created(), r_made + round);
        assert_eq!(r.t.accepted_from(&address("127.0.0.2")), 1);
        assert_eq!(r.t.accepted_from(&address("127.0.0.1")), 1);
    }
    a.write_to(&r, 2).expect("the writer named still writes");
    assert_eq!(a.qps_created(), a_made, "the writer had to reconnect");
    assert_eq!(r.qps_created(), r_made + 2);
}

#[test]
fn over_ipc_each_connection_is_a_requester_of_its_own() {
    let mut c = config(None, &[]);
    let path = std::env::temp_dir().join(format!("ferry-verbs-ipc-{}", std::process::id()));
    c.listen = Some(format!("ipc://{}", path.display()));
    let r = node(&c);
    let mut a = node(&config(None, &[]));
    a.write_to(&r, 1).expect("a writer writes over ipc");
    let (r_made, a_made) = (r.qps_created(), a.qps_created());
    // Every process on the host shares its address ("localhost", if
    // libzmq names one): a request in `a`'s name on another connection
    // still gets a queue pair of its own.
    let got = stranger(r.t.endpoint(), None, request_from(&r, a.t.session_id()));
    assert!(matches!(reply(got), Reply::Accept { .. }));
    assert_eq!(r.t.accepted(), 2);
    a.write_to(&r, 2).expect("the writer named still writes");
    assert_eq!(a.qps_created(), a_made);
    assert_eq!(r.qps_created(), r_made + 1);
    drop(r);
    let _ = std::fs::remove_file(&path);
}

/// From a ZeroMQ context of its own, sends `n` requests to `target` over
/// one connection to `endpoint`, each naming another writer session;
/// returns how many were accepted.
fn flood(endpoint: &str, target: &Node, n: u64) -> u64 {
    let requests: Vec<Vec<u8>> = (1..=n)
        .map(|i| {
            let from = Session {
                incarnation: i,
                generation: 0,
                endpoint: "tcp://127.0.0.2:9".into(),
                key: None,
            }
            .to_string();
            request_from(target, &from)
        })
        .collect();
    let endpoint = endpoint.to_owned();
    std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::DEALER).unwrap();
        s.set_linger(0).unwrap();
        s.set_rcvtimeo(10_000).unwrap();
        s.connect(&endpoint).unwrap();
        let mut accepted = 0;
        // In batches the sockets' queues hold (the ROUTER drops replies a
        // full queue has no room for).
        for batch in requests.chunks(50) {
            for r in batch {
                s.send(r, 0).unwrap();
            }
            for _ in batch {
                let bytes = s.recv_bytes(0).expect("a reply within 10 s");
                if matches!(Reply::decode(&bytes, "target"), Ok(Reply::Accept { .. })) {
                    accepted += 1;
                }
            }
        }
        accepted
    })
    .join()
    .unwrap()
}

#[test]
fn a_flood_of_requests_from_one_requester_drops_only_its_own_queue_pairs() {
    // The defaults (the flooder's own cap binds), then a total that binds
    // first.
    for (max_writers, max_per_writer, kept) in [(4096, 64, 64), (4, 100, 3)] {
        let mut c = config(None, &[]);
        c.max_writers = max_writers;
        c.max_per_writer = max_per_writer;
        let mut r = node(&c);
        let mut a = node(&config(None, &[]));
        a.write_to(&r, 1).expect("a writer writes");
        let a_made = a.qps_created();
        let flooder = from_other_address(r.t.endpoint());
        assert_eq!(flood(&flooder, &r, 5000), 5000);
        assert_eq!(r.t.accepted_from(&address("127.0.0.2")), kept);
        assert_eq!(r.t.accepted_from(&address("127.0.0.1")), 1);
        assert_eq!(r.t.accepted(), kept + 1);
        // `a`'s queue pair lived through it.
        r.fill(0);
        a.fill(0x77);
        a.write_to(&r, 2).expect("the writer still writes");
        assert!(r.bytes()[..64].iter().all(|&b| b == 0x77));
        assert_eq!(a.qps_created(), a_made, "the writer had to reconnect");
    }
}

#[test]
fn an_oversize_request_drops_its_connection_and_the_side_channel_serves_on() {
    use zmq::{MonitorEvent, SocketEvent};
    let r = node(&config(None, &[]));
    let made = r.qps_created();
    let endpoint = r.t.endpoint().to_owned();
    let (dropped, answered) = std::thread::spawn(move || {
        let ctx = zmq::Context::new();
        let s = ctx.socket(zmq::DEALER).unwrap();
        s.set_linger(0).unwrap();
        s.monitor("inproc://oversize", SocketEvent::DISCONNECTED as i32)
            .unwrap();
        let watch = ctx.socket(zmq::PAIR).unwrap();
        watch.connect("inproc://oversize").unwrap();
        s.connect(&endpoint).unwrap();
        s.send(vec![b' '; 1 << 20], 0).unwrap();
        let dropped = watch.poll(zmq::POLLIN, 5000).unwrap() > 0
            && watch
                .recv_multipart(0)
                .ok()
                .and_then(|f| MonitorEvent::parse(f.first()?)?.event())
                == Some(SocketEvent::DISCONNECTED);
        (dropped, s.poll(zmq::POLLIN, 200).unwrap() > 0)
    })
    .join()
    .unwrap();
    assert!(dropped, "the side channel kept the connection");
    assert!(!answered, "the side channel answered it");
    assert_eq!(r.qps_created(), made);
    // Others are served: a request just within the bound...
    let fits = padded(request_for(&r));
    assert_eq!(fits.len(), crate::exchange::MAX_MESSAGE);
    assert!(matches!(
        reply(stranger(r.t.endpoint(), None, fits)),
        Reply::Accept { .. }
    ));
    // ...and a writer.
    let mut a = node(&config(None, &[]));
    a.write_to(&r, 1).expect("a writer writes");
}
