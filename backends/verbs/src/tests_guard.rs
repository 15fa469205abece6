//! The side channel behind its guard, over the software stand-in: real
//! ZeroMQ sockets on loopback TCP, strangers with their own ZeroMQ
//! contexts, the real exchange; only the NIC is simulated.

#![allow(unsafe_code)] // Registering test pools and reading them back.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{Region, Transport, WriteOp, WriteTag};
use tensorferry_hostmem::HostPool;
use tensorferry_zmq::CurveKeyPair;

use crate::error::VerbsError;
use crate::exchange::{QpInfo, Request};
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
    let s = Session::parse(target.t.session_id()).unwrap();
    Request {
        from: "verbs:00000000000000aa@tcp://127.0.0.1:9".into(),
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
    // From 127.0.0.1, an allowed address, with a valid request naming the
    // current incarnation: no reply, and no queue pair made.
    assert_eq!(stranger(&endpoint, None, request_for(&r)), None);
    let kx = CurveKeyPair::generate().unwrap();
    assert_eq!(
        stranger(&endpoint, Some((kx, *kr.public())), request_for(&r)),
        None
    );
    assert_eq!(
        r.qps_created(),
        made,
        "the side channel acted on a stranger"
    );
    assert!(r.t.refused() > 0, "the handler refused nothing");
    // The same request from an admitted key is answered: it was valid.
    let reply = stranger(&endpoint, Some((ka, *kr.public())), request_for(&r));
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
