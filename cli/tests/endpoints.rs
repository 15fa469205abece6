//! Every socket `ferry coordinator` and `ferry instance` listen on is one
//! the book's endpoint table names (docs/src/operating.md, "Endpoints the
//! processes open"), read from `/proc`, and at each a stranger is refused
//! before a byte of it is read or acted on: plain ZeroMQ (no key) from an
//! address the allow-list admits, and from one it does not; at the
//! libfabric provider's own listener, writes and reads with guessed
//! memory keys. Meanwhile the instances hand off, every byte checked, and
//! the receiver's pool beyond the slots stays untouched.

// Without the libfabric plane, the bindings only its rows use stand idle.
#![cfg_attr(not(feature = "fabric"), allow(unused_mut, unused_variables))]

mod common;
#[path = "../../tests/common/listeners.rs"]
mod listeners;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

use common::flood::{aim, await_handoffs, finish_untouched, flood, MAGIC};
use common::keys::{curve, keys};
use common::{coordinator_with, free_port, instance_at, num, tcp, Procs, SMALL_RANDOM};
use listeners::{book, listening, proc_address};
use serde_json::Value;
use tensorferry_zmq::zmq;

/// Checks that every socket `pid` listens on is named: `known` maps a
/// port to the endpoint the book calls it, for the book's `process`.
fn only_what_the_book_names(
    book: &HashSet<(String, String)>,
    process: &str,
    pid: u32,
    known: &[(u16, &str)],
) -> Vec<SocketAddr> {
    let (tcp, unix) = listening(pid);
    assert!(
        unix.is_empty(),
        "{process} listens on unix sockets {unix:?}"
    );
    for addr in &tcp {
        let Some((_, endpoint)) = known.iter().find(|(p, _)| *p == addr.port()) else {
            panic!("{process} (pid {pid}) listens on {addr}, which the book's endpoint table does not name");
        };
        assert!(
            book.contains(&(process.to_owned(), (*endpoint).to_owned())),
            "the book's endpoint table has no `{endpoint}` row for `{process}`"
        );
    }
    for (port, endpoint) in known {
        assert!(
            tcp.iter().any(|a| a.port() == *port),
            "{process}'s {endpoint} endpoint (port {port}) is not listening"
        );
    }
    tcp
}

/// The port of a `{"event":"metrics","url":...}` line.
fn metrics_port(line: &str) -> u16 {
    let v: Value = serde_json::from_str(line).unwrap();
    let url = v["url"].as_str().unwrap();
    let addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    assert!(
        addr.ip().is_loopback(),
        "metrics served on {addr}, not loopback"
    );
    addr.port()
}

/// Strangers' PUSH sockets to `to`, each stopped by one guard alone:
/// from 127.0.0.1, an address the allow-list admits, plain ZeroMQ (no
/// key: CURVE refuses it) and CURVE with a key nobody admitted (the key
/// check refuses it); from 127.0.0.2, one it does not admit, plain and
/// with a key `to` admits (`admitted`, the secret certificate of a
/// process it takes messages from; `server`, its own public one): the
/// allow-list refuses it.
fn strangers(ctx: &zmq::Context, to: &str, admitted: &Path, server: &Path) -> Vec<zmq::Socket> {
    let dest = to.trim_start_matches("tcp://");
    let outside = format!("tcp://127.0.0.2:0;{dest}");
    let socket = |ep: &str, key: Option<(&Path, &Path)>| {
        let s = ctx.socket(zmq::PUSH).unwrap();
        s.set_sndhwm(100_000).unwrap();
        s.set_linger(0).unwrap();
        if let Some((mine, theirs)) = key {
            let pair = tensorferry_zmq::read_key_pair(mine).unwrap();
            let server = tensorferry_zmq::read_public_key(theirs).unwrap();
            s.set_curve_serverkey(&server.0).unwrap();
            s.set_curve_publickey(&pair.public().0).unwrap();
            s.set_curve_secretkey(
                &tensorferry_zmq::CurvePublicKey::from_z85(&pair.secret_z85())
                    .unwrap()
                    .0,
            )
            .unwrap();
        }
        s.connect(ep).unwrap();
        s
    };
    let unlisted = admitted.with_file_name("unlisted.key_secret");
    if !unlisted.exists() {
        let pair = tensorferry_zmq::CurveKeyPair::generate().unwrap();
        let dir = admitted.parent().unwrap().join("unlisted");
        tensorferry_zmq::write_certificates(&dir, "unlisted", &pair).unwrap();
        std::fs::rename(dir.join("unlisted.key_secret"), &unlisted).unwrap();
    }
    vec![
        socket(to, None),
        socket(to, Some((&unlisted, server))),
        socket(&outside, None),
        socket(&outside, Some((admitted, server))),
    ]
}

/// The data plane under test.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Plane {
    Shm,
    #[cfg(feature = "fabric")]
    FabricTcp,
}

impl Plane {
    fn args(self) -> Vec<&'static str> {
        match self {
            Self::Shm => vec![],
            #[cfg(feature = "fabric")]
            Self::FabricTcp => common::FABRIC_TCP.to_vec(),
        }
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The port of a libfabric `tcp` session id's address (a sockaddr_in in
/// hex: family, then the port in network order).
#[cfg(feature = "fabric")]
fn fabric_port(session: &str) -> u16 {
    let s = tensorferry_fabric::session::Session::parse(session).unwrap();
    u16::from_be_bytes([s.addr[2], s.addr[3]])
}

/// Bytes of `len` at `addr` in process `pid`'s memory.
#[cfg(feature = "fabric")]
fn memory_of(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, addr).unwrap();
    buf
}

/// From a libfabric transport of its own (the `tcp` provider, no key
/// given to it), a stranger writes into the instance's pool and reads
/// from it under guessed keys: every one fails, and nothing is written.
#[cfg(feature = "fabric")]
fn guess_keys(session: &str) -> usize {
    use std::time::{Duration, Instant};
    use tensorferry::core::transport::{ReadOp, Transport, WriteOp, WriteTag};
    use tensorferry_fabric::session::{RemoteRegion, Session};
    use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

    let real = Session::parse(session).unwrap();
    let mut c = FabricConfig::new(Provider::Named("tcp;ofi_rxm".into()));
    c.delivery = DeliveryMode::Complete;
    c.source = Some("127.0.0.1".into());
    c.write_timeout = Duration::from_secs(2);
    let mut t = FabricTransport::with_pool(&c, 1 << 20).unwrap();
    let (p, n) = (t.pool_ptr(), t.pool_len());
    // SAFETY: the transport's own pool, registered for its life.
    let region = unsafe { t.register(p, n) }.unwrap();
    // SAFETY: the pool is the transport's, and no operation into it runs.
    unsafe { std::slice::from_raw_parts_mut(p, n) }.fill(0xee);
    let base = real.regions[0].base;
    let mut tried = 0;
    for (i, key) in [1u64, 2, 3, 0x1234_5678_9abc_def0, u64::MAX]
        .into_iter()
        .enumerate()
    {
        let forged = Session {
            regions: vec![RemoteRegion {
                key,
                base,
                len: real.regions[0].len,
            }],
            ..real.clone()
        }
        .encode();
        let cookie = 2 * i as u64;
        t.post_write(&WriteOp {
            region,
            local_offset: 0,
            len: 4096,
            dest_session: &forged,
            dest_addr: base + real.regions[0].len - 4096,
            tag: WriteTag(cookie),
            cookie,
        })
        .unwrap();
        t.post_read(&ReadOp {
            region,
            local_offset: 4096,
            len: 4096,
            src_session: &forged,
            src_addr: base,
            cookie: cookie + 1,
        })
        .unwrap();
        let mut seen = 0;
        let end = Instant::now() + Duration::from_secs(10);
        while seen < 2 && Instant::now() < end {
            if let Some(done) = t.poll_completion() {
                assert!(
                    done.result.is_err(),
                    "an operation under the guessed key {key:#x} succeeded"
                );
                seen += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(seen, 2, "both operations under key {key:#x} ended");
        tried += 2;
    }
    // SAFETY: as above; every operation has ended.
    let read_back = unsafe { std::slice::from_raw_parts(p.add(4096), 4096) };
    assert!(
        read_back.iter().all(|&b| b == 0xee),
        "a byte of the instance's pool was read"
    );
    tried
}

/// A coordinator and an encoder and a denoiser on `plane`, with CURVE and
/// an allow-list; strangers at every endpoint while 200 requests hand off.
fn strangers_are_refused_at_every_endpoint(plane: Plane) {
    let book = book(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let mut p = Procs::new(&format!("endpoints-{plane:?}"));
    let keys = keys(p.dir.join("keys"), &["encoder", "denoiser"]);
    let allow = vec!["--allow-from".to_owned(), "127.0.0.1".to_owned()];
    let metrics = vec!["--metrics-listen".to_owned(), "0".to_owned()];

    let result_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let results: Vec<String> = result_ports.iter().map(|&p| tcp(p)).collect();
    let mut extra = allow.clone();
    extra.extend(curve(&keys, "coordinator"));
    extra.extend(metrics.clone());
    let c = coordinator_with(&mut p, &results, &strs(&extra));
    let c_metrics = metrics_port(&p.wait_for(c, "\"event\":\"metrics\"", 30));

    let instance = |role: &'static str, ep: u16, more: &[&str]| {
        let coordinator = &results[if role == "encoder" { 0 } else { 1 }];
        let mut cmd = instance_at(role, role, coordinator, &tcp(ep));
        cmd.args(SMALL_RANDOM)
            .args(strs(&allow))
            .args(strs(&curve(&keys, role)))
            .args(strs(&metrics))
            .args(plane.args())
            .args(more);
        cmd
    };
    let den_port = free_port();
    let d = p.spawn("denoiser", &mut instance("denoiser", den_port, &[]));
    let d_metrics = metrics_port(&p.wait_for(d, "\"event\":\"metrics\"", 30));
    let registered = p.wait_for(d, "\"event\":\"registered\"", 30);
    let d_pid = num(&registered, "pid") as u32;
    let session = serde_json::from_str::<Value>(&registered).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let enc_port = free_port();
    let e = p.spawn(
        "encoder",
        &mut instance(
            "encoder",
            enc_port,
            &["--requests", "200", "--window", "2", "--pace-ms", "5"],
        ),
    );
    let e_metrics = metrics_port(&p.wait_for(e, "\"event\":\"metrics\"", 30));
    let e_registered = p.wait_for(e, "\"event\":\"registered\"", 30);
    let e_pid = num(&e_registered, "pid") as u32;
    let c_pid = p.pid(c);

    // What each listens on is what the book names.
    let mut coordinator_known: Vec<(u16, &str)> =
        result_ports.iter().map(|&p| (p, "result")).collect();
    coordinator_known.push((c_metrics, "metrics"));
    only_what_the_book_names(&book, "ferry coordinator", c_pid, &coordinator_known);
    let mut den_known = vec![(den_port, "work"), (d_metrics, "metrics")];
    let mut enc_known = vec![(enc_port, "work"), (e_metrics, "metrics")];
    #[cfg(feature = "fabric")]
    if plane == Plane::FabricTcp {
        den_known.push((fabric_port(&session), "fabric"));
        let e_session = serde_json::from_str::<Value>(&e_registered).unwrap()["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
        enc_known.push((fabric_port(&e_session), "fabric"));
    }
    only_what_the_book_names(&book, "ferry instance", d_pid, &den_known);
    only_what_the_book_names(&book, "ferry instance", e_pid, &enc_known);

    // Strangers at every ZeroMQ endpoint, while the hand-offs run: plain
    // ZeroMQ from an admitted address, and from one outside the list.
    let ctx = zmq::Context::new();
    let mut targets = Vec::new();
    let coordinator_key = (
        keys.join("coordinator/coordinator.key_secret"),
        keys.join("coordinator/coordinator.key"),
    );
    for to in &results {
        let admitted = keys.join("instances/encoder.key_secret");
        targets.extend(strangers(&ctx, to, &admitted, &coordinator_key.1));
    }
    for (ep, name) in [(den_port, "denoiser"), (enc_port, "encoder")] {
        let server = keys.join(format!("instances/{name}.key"));
        targets.extend(strangers(&ctx, &tcp(ep), &coordinator_key.0, &server));
    }
    let (dest_session, dest) = match plane {
        Plane::Shm => aim(&registered),
        #[cfg(feature = "fabric")]
        Plane::FabricTcp => {
            let s = tensorferry_fabric::session::Session::parse(&session).unwrap();
            let r = &s.regions[0];
            (session.clone(), r.base + r.len - (1 << 20))
        }
    };
    let top_before: Option<Vec<u8>> = match plane {
        Plane::Shm => None,
        #[cfg(feature = "fabric")]
        Plane::FabricTcp => Some(memory_of(d_pid, dest, 1 << 20)),
    };
    let forged = flood(&targets, &dest_session, dest, true);
    assert!(forged > 1000, "only {forged} forged messages sent");
    // A raw registration naming the denoiser's endpoint, too.
    let reg = serde_json::json!({"msg_type": "transfer_register", "role": "denoiser",
        "session_id": "x", "pool_ptr": 0, "pool_size": 1 << 30, "work_endpoint": tcp(den_port)});
    for t in &targets {
        let _ = t.send_multipart([MAGIC, reg.to_string().as_bytes()], zmq::DONTWAIT);
    }
    #[cfg(feature = "fabric")]
    if plane == Plane::FabricTcp {
        assert_eq!(guess_keys(&session), 10);
    }
    await_handoffs(&mut p, e, c, 200);
    drop(targets);

    // Nothing of theirs was read: no message ignored or malformed at any
    // process, the registrations as they were, every byte the denoiser
    // got the encoder's, and its pool beyond its slots untouched.
    match plane {
        Plane::Shm => assert_eq!(common::flood::written_at_the_top(&p, &registered), 0),
        #[cfg(feature = "fabric")]
        Plane::FabricTcp => assert!(
            memory_of(d_pid, dest, 1 << 20) == top_before.unwrap(),
            "the denoiser's pool beyond its slots changed"
        ),
    }
    finish_untouched(&mut p, d, e, c, 200);
}

#[test]
fn over_shared_memory_strangers_are_refused_at_every_endpoint_the_book_names() {
    strangers_are_refused_at_every_endpoint(Plane::Shm);
}

#[cfg(feature = "fabric")]
#[test]
fn over_libfabric_tcp_strangers_are_refused_at_every_endpoint_the_book_names() {
    strangers_are_refused_at_every_endpoint(Plane::FabricTcp);
}

/// The parser of /proc's addresses reads what the kernel writes.
#[test]
fn proc_addresses_read_as_the_kernel_writes_them() {
    assert_eq!(
        proc_address("0100007F:1F90"),
        Some("127.0.0.1:8080".parse().unwrap())
    );
    assert_eq!(
        proc_address("00000000000000000000000001000000:0050"),
        Some("[::1]:80".parse().unwrap())
    );
}
