//! The transport end to end over the software stand-in: real side-channel
//! sockets (ZeroMQ over loopback TCP), the real connection bookkeeping,
//! chunking and error paths; only the NIC is simulated.

#![allow(unsafe_code)] // Registering test pools and reading them back.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Completion, Fault, FaultKind, ReadOp, Region, RegionError, Transport, WriteOp, WriteTag,
};
use tensorferry_hostmem::HostPool;

use crate::attrs::QpStep;
use crate::conn::ConnState;
use crate::device::Verb;
use crate::error::VerbsError;
use crate::sim::SimDevice;
use crate::status::WcStatus;
use crate::transport::{VerbsConfig, VerbsTransport};

mod cancel;
mod read;

struct Node {
    t: VerbsTransport<SimDevice>,
    pool: HostPool,
    region: Region,
}

fn config() -> VerbsConfig {
    let mut c = VerbsConfig::new("sim");
    c.write_timeout = Duration::from_millis(800);
    c.connect_timeout = Duration::from_millis(500);
    c.send_depth = 8;
    c
}

fn node_with(config: &VerbsConfig, max_msg: u32, pool_len: usize) -> Node {
    let device = SimDevice::new([127, 0, 0, 1], max_msg);
    let mut t = VerbsTransport::with_device(device, config).expect("open over the stand-in");
    let pool = HostPool::new(pool_len).expect("map a pool");
    // SAFETY: the pool outlives the transport's registration (dropped
    // after it in every test: `Node` declares `t` first).
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.expect("register");
    Node { t, pool, region }
}

fn node() -> Node {
    node_with(&config(), 4096, 1 << 20)
}

impl Node {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the test owns the pool and reads it while no write into
        // it is in flight.
        unsafe { std::slice::from_raw_parts(self.pool.ptr(), self.pool.len()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` keeps other views away.
        unsafe { std::slice::from_raw_parts_mut(self.pool.ptr(), self.pool.len()) }
    }

    fn write(
        &mut self,
        off: u64,
        len: u64,
        to: &Node,
        dest_off: u64,
        cookie: u64,
    ) -> Result<(), VerbsError> {
        self.t.post_write(&WriteOp {
            region: self.region,
            local_offset: off,
            len,
            dest_session: to.t.session_id(),
            dest_addr: to.region.addr + dest_off,
            tag: WriteTag(cookie),
            cookie,
        })
    }

    fn read(
        &mut self,
        off: u64,
        len: u64,
        from: &Node,
        src_off: u64,
        cookie: u64,
    ) -> Result<(), VerbsError> {
        self.t.post_read(&ReadOp {
            region: self.region,
            local_offset: off,
            len,
            src_session: from.t.session_id(),
            src_addr: from.region.addr + src_off,
            cookie,
        })
    }

    fn wait(&mut self, n: usize) -> Vec<Completion<VerbsError>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            match self.t.poll_completion() {
                Some(c) => out.push(c),
                None if Instant::now() > deadline => {
                    panic!("only {} of {n} completions", out.len())
                }
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        out
    }
}

/// A transfer of 16 work requests (the stand-in's 4 KiB messages): the
/// window of 8 posts half of them, the rest wait in the book.
const LEN: u64 = 64 << 10;

/// Where connecting writes go, away from the transfers under test.
const ASIDE: u64 = 512 << 10;

/// Connects `a` to `to` with a one-byte write.
fn connect(a: &mut Node, to: &Node, cookie: u64) {
    a.write(0, 1, to, ASIDE, cookie).unwrap();
    let c = a.wait(1).remove(0);
    assert!(c.result.is_ok(), "{:?}", c.result);
}

/// The peers of `a`'s queue pairs stop (or go on) taking work.
fn stall(a: &Node, on: bool) {
    a.t.with_device_mut(|d| d.stall = on);
}

/// Work requests waiting on `a`'s queue pairs.
fn waiting(a: &Node) -> usize {
    a.t.with_device_mut(|d| d.waiting())
}

/// The peers of `a`'s queue pairs go on after ended transfers: whatever
/// still waited runs now, unless it was flushed, and nothing completes.
fn release(a: &mut Node) {
    stall(a, false);
    for _ in 0..20 {
        // Each poll lets the stand-in run what still waits.
        if let Some(c) = a.t.poll_completion() {
            panic!("a stray completion after the transfers ended: {c:?}");
        }
    }
    assert_eq!(waiting(a), 0);
}

/// Everything the transport has to report now, by cookie.
fn drain(a: &mut Node) -> Vec<Completion<VerbsError>> {
    let mut done: Vec<_> = std::iter::from_fn(|| a.t.poll_completion()).collect();
    done.sort_by_key(|c| c.cookie);
    done
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

#[test]
fn random_writes_arrive_byte_exact_through_chunks_and_a_small_window() {
    let mut a = node();
    let b = node();
    fill(a.bytes_mut(), 7);
    let mut x = 12345u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pool = 1u64 << 20;
    let mut expected = vec![0u8; pool as usize];
    for round in 0..20 {
        let mut writes = Vec::new();
        // Disjoint destinations within a round so every byte is decided.
        let mut dest = 0u64;
        for i in 0..15 {
            let len = match i {
                0 => 1,
                1 => 4096,
                2 => 4097,
                _ => next() % 40_000,
            };
            if dest + len > pool {
                break;
            }
            let src = next() % (pool - len + 1);
            writes.push((src, len, dest));
            dest += len + next() % 64;
        }
        for (i, &(src, len, dst)) in writes.iter().enumerate() {
            a.write(src, len, &b, dst, (round * 100 + i) as u64)
                .expect("post");
            expected[dst as usize..(dst + len) as usize]
                .copy_from_slice(&a.bytes()[src as usize..(src + len) as usize]);
        }
        let mut done = a.wait(writes.len());
        done.sort_by_key(|c| c.cookie);
        for (i, c) in done.iter().enumerate() {
            assert_eq!(c.cookie, (round * 100 + i) as u64);
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        for &(_, len, dst) in &writes {
            let r = dst as usize..(dst + len) as usize;
            assert_eq!(b.bytes()[r.clone()], expected[r], "round {round}");
        }
    }
    assert_eq!(a.t.connection(b.t.session_id()), Some(ConnState::Ready));
    assert_eq!(
        a.t.with_device_mut(|d| d.qps_created),
        1,
        "one QP per peer session"
    );
}

#[test]
fn both_queue_pairs_walk_init_rtr_rts_with_matching_psns() {
    let mut a = node();
    let b = node();
    a.write(0, 100, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    let a_log = a.t.with_device_mut(|d| d.log.clone());
    let b_log = b.t.with_device_mut(|d| d.log.clone());
    let walk = |log: &[(u32, QpStep)]| -> (u32, u32, u32, u32) {
        assert_eq!(log.len(), 3, "{log:?}");
        assert!(matches!(
            log[0].1,
            QpStep::Init {
                port: 1,
                pkey_index: 0,
                remote_write: true,
                remote_read: true,
            }
        ));
        let QpStep::Rtr {
            dest_qpn,
            rq_psn,
            av,
            path_mtu,
            ..
        } = log[1].1
        else {
            panic!("{log:?}")
        };
        let grh = av.grh.expect("RoCE needs a GRH");
        assert_eq!(grh.sgid_index, 3, "RoCE v2, IPv4-mapped");
        assert_eq!(grh.dgid[12..], [127, 0, 0, 1]);
        assert_eq!(path_mtu, 3);
        let QpStep::Rts {
            timeout,
            retry_cnt,
            rnr_retry,
            sq_psn,
            ..
        } = log[2].1
        else {
            panic!("{log:?}")
        };
        assert_eq!((timeout, retry_cnt, rnr_retry), (14, 7, 7));
        (log[0].0, dest_qpn, rq_psn, sq_psn)
    };
    let (a_qpn, a_dest, a_rq, a_sq) = walk(&a_log);
    let (b_qpn, b_dest, b_rq, b_sq) = walk(&b_log);
    assert_eq!(a_dest, b_qpn);
    assert_eq!(b_dest, a_qpn);
    assert_eq!(
        a_rq, b_sq,
        "each end receives from the PSN the other sends from"
    );
    assert_eq!(b_rq, a_sq);
    assert!(a_sq <= 0xff_ffff && b_sq <= 0xff_ffff);
}

#[test]
fn a_completion_error_names_the_peer_and_status_and_the_next_write_reconnects() {
    let mut a = node();
    let b = node();
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    a.t.with_device_mut(|d| d.fail_next = Some(WcStatus::REMOTE_ACCESS));
    a.write(0, 10_000, &b, 0, 2).unwrap();
    a.write(0, 10, &b, 50_000, 3).unwrap();
    let done = a.wait(2);
    let first = done.iter().find(|c| c.cookie == 2).unwrap();
    match &first.result {
        Err(e @ VerbsError::Completion { peer, status, .. }) => {
            assert_eq!(peer, b.t.session_id());
            assert_eq!(*status, WcStatus::REMOTE_ACCESS);
            assert_eq!(e.kind(), FaultKind::OutOfBounds);
            assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let second = done.iter().find(|c| c.cookie == 3).unwrap();
    assert!(
        second.result.is_err(),
        "a write behind the failed one fails with it"
    );
    assert_eq!(
        a.t.connection(b.t.session_id()),
        None,
        "the connection is dropped"
    );
    fill(&mut a.bytes_mut()[..64], 99);
    a.write(0, 64, &b, 200_000, 4).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    assert_eq!(b.bytes()[200_000..200_064], a.bytes()[..64]);
    assert_eq!(
        a.t.with_device_mut(|d| d.qps_created),
        2,
        "rebuilt on next use"
    );
    assert_eq!(a.t.connection(b.t.session_id()), Some(ConnState::Ready));
}

#[test]
fn a_peer_that_disappears_fails_its_writes_and_its_endpoint_then_times_out() {
    let mut a = node();
    let b = node();
    let b_session = b.t.session_id().to_owned();
    let b_addr = b.region.addr;
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    drop(b);
    a.t.post_write(&WriteOp {
        region: a.region,
        local_offset: 0,
        len: 10,
        dest_session: &b_session,
        dest_addr: b_addr,
        tag: WriteTag(2),
        cookie: 2,
    })
    .unwrap();
    let c = a.wait(1).remove(0);
    match &c.result {
        Err(e @ VerbsError::Completion { status, .. }) => {
            assert_eq!(*status, WcStatus::RETRY_EXCEEDED);
            assert_eq!(e.kind(), FaultKind::PeerGone);
        }
        other => panic!("{other:?}"),
    }
    // Nobody answers on the old endpoint now: the exchange times out.
    let t0 = Instant::now();
    a.t.post_write(&WriteOp {
        region: a.region,
        local_offset: 0,
        len: 10,
        dest_session: &b_session,
        dest_addr: b_addr,
        tag: WriteTag(3),
        cookie: 3,
    })
    .unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::ConnectTimeout { peer, .. }) => assert_eq!(peer, b_session),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_session_of_an_earlier_incarnation_is_refused() {
    let mut a = node();
    let b = node();
    let s = crate::session::Session::parse(b.t.session_id()).unwrap();
    let stale = crate::session::Session {
        generation: s.generation,
        incarnation: s.incarnation ^ 1,
        ..s
    }
    .to_string();
    a.t.post_write(&WriteOp {
        region: a.region,
        local_offset: 0,
        len: 10,
        dest_session: &stale,
        dest_addr: b.region.addr,
        tag: WriteTag(1),
        cookie: 1,
    })
    .unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::Refused { .. }) => {
            assert!(e.to_string().contains("stale session"), "{e}");
            assert_eq!(e.kind(), FaultKind::PeerGone);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_rtr_timeout_is_reported_as_a_gid_or_route_problem() {
    let mut a = node();
    let b = node();
    a.t.with_device_mut(|d| d.rtr_errno = Some(libc::ETIMEDOUT));
    a.write(0, 10, &b, 0, 1).unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::RouteTimeout { .. }) => {
            let s = e.to_string();
            assert!(s.contains("GID index"), "{s}");
            assert!(s.contains("::ffff:127.0.0.1"), "{s}");
        }
        other => panic!("{other:?}"),
    }
    // On the target's side the same failure refuses the request, with the
    // same explanation.
    a.t.with_device_mut(|d| d.rtr_errno = None);
    b.t.with_device_mut(|d| d.rtr_errno = Some(libc::ETIMEDOUT));
    a.write(0, 10, &b, 0, 2).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Refused { why, .. }) => assert!(why.contains("GID index"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stalled_peer_times_writes_out_and_the_connection_is_rebuilt() {
    let mut a = node();
    let b = node();
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    a.t.with_device_mut(|d| d.hold = true);
    let t0 = Instant::now();
    a.write(0, 10, &b, 0, 2).unwrap();
    a.write(0, 10, &b, 100, 3).unwrap();
    let done = a.wait(2);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    let timed_out = done.iter().find(|c| c.cookie == 2).unwrap();
    assert!(
        matches!(timed_out.result, Err(VerbsError::Timeout { .. })),
        "{:?}",
        timed_out.result
    );
    assert!(matches!(
        done.iter().find(|c| c.cookie == 3).unwrap().result,
        Err(VerbsError::Broken { .. })
    ));
    // Completions of the failed connection that turn up late are ignored;
    // the next write gets a new queue pair.
    a.t.with_device_mut(|d| d.hold = false);
    a.write(0, 10, &b, 0, 4).unwrap();
    let c = a.wait(1).remove(0);
    assert_eq!(c.cookie, 4);
    assert!(c.result.is_ok(), "{:?}", c.result);
    assert!(a.t.poll_completion().is_none(), "no stray completions");
    assert_eq!(a.t.with_device_mut(|d| d.qps_created), 2);
}

#[test]
fn bad_writes_are_refused_with_typed_errors() {
    let mut a = node();
    let b = node();
    let len = a.pool.len() as u64;
    match a.write(len - 5, 10, &b, 0, 1) {
        Err(e @ VerbsError::Region(RegionError::SourceOutOfBounds { .. })) => {
            assert_eq!(e.kind(), FaultKind::OutOfBounds)
        }
        other => panic!("{other:?}"),
    }
    let unknown = Region { id: 9, ..a.region };
    assert!(matches!(
        a.t.post_write(&WriteOp {
            region: unknown,
            local_offset: 0,
            len: 1,
            dest_session: b.t.session_id(),
            dest_addr: b.region.addr,
            tag: WriteTag(1),
            cookie: 1
        }),
        Err(VerbsError::Region(RegionError::Unknown(9)))
    ));
    assert!(matches!(
        a.t.post_write(&WriteOp {
            region: a.region,
            local_offset: 0,
            len: 1,
            dest_session: "shm:/x@0+1",
            dest_addr: 0,
            tag: WriteTag(1),
            cookie: 1
        }),
        Err(VerbsError::BadSession { .. })
    ));
    // Before the connection exists the peer's bounds are unknown: the
    // write is refused once they are.
    a.write(0, 10, &b, b.pool.len() as u64 - 5, 2).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::DestOutOfBounds { peer, .. }) => assert_eq!(peer, b.t.session_id()),
        other => panic!("{other:?}"),
    }
    // Now it is known, and refused at once.
    assert!(matches!(
        a.write(0, 10, &b, b.pool.len() as u64 - 5, 3),
        Err(VerbsError::DestOutOfBounds { .. })
    ));
    assert!(matches!(
        a.t.post_write(&WriteOp {
            region: a.region,
            local_offset: 0,
            len: 1,
            dest_session: b.t.session_id(),
            dest_addr: b.region.addr - 1,
            tag: WriteTag(4),
            cookie: 4
        }),
        Err(VerbsError::DestOutOfBounds { .. })
    ));
    // The connection is still good.
    a.write(0, 10, &b, 0, 5).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    // A zero-byte write completes without a work request.
    a.write(0, 0, &b, 0, 6).unwrap();
    assert_eq!(a.wait(1)[0].cookie, 6);
}

/// A transport registers any number of regions; writers learn them in the
/// connection exchange, and a region registered later reaches them
/// through the session id's new generation (a writer connects once per
/// session id).
#[test]
fn several_regions_are_written_and_a_later_one_reaches_writers_through_the_session_id() {
    // Declared first, dropped last: they outlive the registrations.
    let extra = HostPool::new(64 << 10).unwrap();
    let src = HostPool::new(64 << 10).unwrap();
    let mut a = node();
    let mut b = node();
    let first = b.t.session_id().to_owned();
    fill(a.bytes_mut(), 3);
    a.write(0, 4096, &b, 0, 1).unwrap();
    assert!(
        a.wait(1)[0].result.is_ok(),
        "connected under the first session"
    );

    // SAFETY: the pools outlive both transports (declared before them)
    // and are read only once the writes into them completed.
    let (rx, rs) = unsafe {
        (
            b.t.register(extra.ptr(), extra.len())
                .expect("a second region"),
            a.t.register(src.ptr(), src.len())
                .expect("a second source region"),
        )
    };
    assert_ne!(rx.id, b.region.id);
    let second = b.t.session_id().to_owned();
    assert_ne!(second, first, "the session id moved on");
    let parsed = crate::session::Session::parse(&second).unwrap();
    assert_eq!(
        parsed.generation, 2,
        "{second}: one change since the pool's"
    );
    let pool_region = a.region;
    let write = |a: &mut Node, region: Region, session: &str, dest_addr: u64, cookie: u64| {
        a.t.post_write(&WriteOp {
            region,
            local_offset: 0,
            len: 4096,
            dest_session: session,
            dest_addr,
            tag: WriteTag(cookie),
            cookie,
        })
    };
    // Under the first session the writer knows only the pool.
    assert!(matches!(
        write(&mut a, pool_region, &first, rx.addr, 2),
        Err(VerbsError::DestOutOfBounds { regions: 1, .. })
    ));
    // Under the second it learns both: into the new region from the
    // pool, and into the pool from the new source region.
    // SAFETY: nothing writes into `src`; it is filled here and read by
    // the device only.
    unsafe { std::slice::from_raw_parts_mut(src.ptr(), 4096) }.fill(0xa5);
    write(&mut a, pool_region, &second, rx.addr + 512, 3).unwrap();
    write(&mut a, rs, &second, b.region.addr + 8192, 4).unwrap();
    for c in a.wait(2) {
        assert!(c.result.is_ok(), "{c:?}");
    }
    // SAFETY: the write into it completed.
    let landed = unsafe { std::slice::from_raw_parts(extra.ptr(), extra.len()) };
    assert_eq!(&landed[512..512 + 4096], &a.bytes()[..4096]);
    assert!(b.bytes()[8192..8192 + 4096].iter().all(|&x| x == 0xa5));

    // Deregistered, a region leaves the exchange: a writer connecting
    // under the next session cannot write into it, and the other
    // region still takes writes.
    b.t.deregister(rx).unwrap();
    assert!(matches!(
        b.t.deregister(rx),
        Err(VerbsError::Region(RegionError::Unknown(_)))
    ));
    let third = b.t.session_id().to_owned();
    write(&mut a, pool_region, &third, rx.addr, 5).unwrap();
    let [c] = &a.wait(1)[..] else { panic!() };
    assert!(
        matches!(
            c.result,
            Err(VerbsError::DestOutOfBounds { regions: 1, .. })
        ),
        "{c:?}"
    );
    write(&mut a, rs, &third, b.region.addr, 6).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    drop((a, b));
}

#[test]
fn a_target_without_a_pool_refuses_and_deregistering_fails_pending_writes() {
    let mut a = node();
    let device = SimDevice::new([127, 0, 0, 1], 4096);
    let bare = VerbsTransport::with_device(device, &config()).unwrap();
    a.t.post_write(&WriteOp {
        region: a.region,
        local_offset: 0,
        len: 10,
        dest_session: bare.session_id(),
        dest_addr: 0,
        tag: WriteTag(1),
        cookie: 1,
    })
    .unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Refused { why, .. }) => {
            assert!(why.contains("no memory is registered"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let b = node();
    a.t.with_device_mut(|d| d.hold = true);
    a.write(0, 10, &b, 0, 2).unwrap();
    // Connection and write in flight (held); deregistration fails it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.t.connection(b.t.session_id()) != Some(ConnState::Ready) {
        assert!(Instant::now() < deadline, "never connected");
        let _ = a.t.poll_completion();
        std::thread::sleep(Duration::from_millis(1));
    }
    a.t.deregister(a.region).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Broken { why, .. }) => assert!(why.contains("deregistered"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        a.t.deregister(a.region),
        Err(VerbsError::Region(RegionError::Unknown(1)))
    ));
}

#[test]
fn the_side_channel_refuses_malformed_requests_without_harm() {
    let b = node();
    let endpoint = b.t.endpoint().to_owned();
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::DEALER).unwrap();
    s.set_rcvtimeo(5000).unwrap();
    s.connect(&endpoint).unwrap();
    for junk in [&b"{"[..], b"", &[0xff; 100][..], &vec![b'x'; 10_000][..]] {
        s.send(junk, 0).unwrap();
        let reply = s.recv_bytes(0).expect("a reply to every request");
        match crate::exchange::Reply::decode(&reply, "b").unwrap() {
            crate::exchange::Reply::Refuse { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // And the transport still accepts a real writer.
    let mut a = node();
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
}

#[test]
fn the_gid_index_can_be_configured_and_a_missing_one_is_named() {
    let mut c = config();
    c.gid = crate::gid::GidChoice::Index(2);
    let n = node_with(&c, 4096, 4096);
    assert_eq!(n.t.gid().0, 2);
    c.gid = crate::gid::GidChoice::Index(7);
    match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
        Err(e @ VerbsError::NoGid { .. }) => assert!(e.to_string().contains("GID index 7"), "{e}"),
        other => panic!("{other:?}"),
    }
    c.gid = crate::gid::GidChoice::Index(1);
    // A link-local GID has no IPv4 address for the side channel.
    match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
        Err(e @ VerbsError::Port { .. }) => {
            assert!(e.to_string().contains("--verbs-listen"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    c.listen = Some("127.0.0.1".into());
    assert!(VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).is_ok());
    // An IPv6 host (IPoIB fabrics) is bracketed into the endpoint.
    c.listen = Some("::1".into());
    let t = VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).unwrap();
    assert!(
        t.session_id().contains("@tcp://[::1]:"),
        "{}",
        t.session_id()
    );
    for wildcard in ["tcp://0.0.0.0:*", "tcp://*:*", "tcp://[::]:*"] {
        c.listen = Some(wildcard.into());
        match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
            Err(VerbsError::Port { .. }) => {}
            Ok(t) => panic!("{wildcard}: bound {}", t.session_id()),
            Err(e) => panic!("{wildcard}: {e}"),
        }
    }
}

#[test]
fn outstanding_work_stays_within_the_cq_across_connections() {
    let mut c = config();
    c.send_depth = 8;
    let mut device = SimDevice::new([127, 0, 0, 1], 1024);
    device.cq_capacity = 3;
    let mut t = VerbsTransport::with_device(device, &c).unwrap();
    let pool = HostPool::new(1 << 20).unwrap();
    // SAFETY: the pool moves into `a` behind the transport, so it is
    // unmapped after the transport (and its registration) is gone.
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.unwrap();
    let mut a = Node { t, pool, region };
    fill(a.bytes_mut(), 3);
    let (b, d) = (node(), node());
    let mut n = 0;
    for round in 0..10u64 {
        for (k, to) in [&b, &d].into_iter().enumerate() {
            // 20 KiB in 1 KiB chunks: 20 work requests per write.
            let off = round * 40_000 + k as u64 * 20_000;
            a.write(off, 20_000, to, off, n).unwrap();
            n += 1;
        }
    }
    for c in a.wait(n as usize) {
        assert!(c.result.is_ok(), "{:?}", c.result);
    }
    assert!(b.bytes()[..400_000]
        .chunks(40_000)
        .zip(a.bytes().chunks(40_000))
        .all(|(x, y)| x[..20_000] == y[..20_000]));
    assert!(d.bytes()[..400_000]
        .chunks(40_000)
        .zip(a.bytes().chunks(40_000))
        .all(|(x, y)| x[20_000..] == y[20_000..]));
    let peak = a.t.with_device_mut(|dev| dev.cq_peak);
    assert!(peak <= 3, "{peak} completions waited in a CQ of 3");
}

#[test]
fn a_target_keeps_its_newest_writers_and_an_evicted_one_reconnects() {
    let mut c = config();
    c.max_writers = 1;
    let b = node_with(&c, 4096, 1 << 20);
    let (mut a, mut w) = (node(), node());
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    w.write(0, 10, &b, 100, 2).unwrap();
    assert!(w.wait(1)[0].result.is_ok());
    // `w` took the only place: `a`'s queue pair at `b` is gone.
    a.write(0, 10, &b, 0, 3).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Completion { status, .. }) => assert_eq!(status, WcStatus::RETRY_EXCEEDED),
        other => panic!("{other:?}"),
    }
    a.write(0, 10, &b, 0, 4).unwrap();
    assert!(a.wait(1)[0].result.is_ok(), "reconnected");
}

#[test]
fn the_wake_descriptor_rises_for_completions_and_for_side_channel_news() {
    use crate::wake::readable;
    let mut a = node();
    let b = node();
    let fd = a.t.wake_fd().expect("a wake descriptor");
    // Connect first, then drain: nothing is pending, the CQ is armed.
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    assert!(a.t.poll_completion().is_none());
    assert!(!readable(fd, 0), "quiet when nothing happened");
    a.write(0, 5000, &b, 0, 2).unwrap();
    assert!(readable(fd, 5000), "a completion raises it");
    let c = a.t.poll_completion().expect("the completion");
    assert_eq!(c.cookie, 2);
    assert!(a.t.poll_completion().is_none());
    assert!(!readable(fd, 0), "cleared once reaped");
    // A refusal is found by the side channel's thread: it raises the
    // descriptor without the caller polling.
    let s = crate::session::Session::parse(b.t.session_id()).unwrap();
    let stale = crate::session::Session {
        generation: s.generation,
        incarnation: s.incarnation ^ 1,
        ..s
    }
    .to_string();
    a.t.post_write(&WriteOp {
        region: a.region,
        local_offset: 0,
        len: 10,
        dest_session: &stale,
        dest_addr: b.region.addr,
        tag: WriteTag(3),
        cookie: 3,
    })
    .unwrap();
    assert!(readable(fd, 5000), "news from the side channel raises it");
    match a.t.poll_completion().map(|c| c.result) {
        Some(Err(VerbsError::Refused { .. })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_writer_keeps_at_most_its_limit_of_idle_connections() {
    let mut c = config();
    c.max_writers = 1;
    let mut a = node_with(&c, 4096, 1 << 20);
    let (b, d) = (node(), node());
    a.write(0, 10, &b, 0, 1).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    a.write(0, 10, &d, 0, 2).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    assert_eq!(
        a.t.connection(b.t.session_id()),
        None,
        "the idle one was closed"
    );
    assert_eq!(a.t.connection(d.t.session_id()), Some(ConnState::Ready));
    a.write(0, 10, &b, 0, 3).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    assert_eq!(a.t.with_device_mut(|dev| dev.qps_created), 3);
}

#[test]
fn a_queue_pair_that_cannot_be_made_fails_the_write_and_wakes_the_caller() {
    use crate::wake::readable;
    let mut a = node();
    let b = node();
    let fd = a.t.wake_fd().unwrap();
    assert!(a.t.poll_completion().is_none());
    a.t.with_device_mut(|d| d.create_errno = Some(libc::ENOMEM));
    a.write(0, 10, &b, 0, 1).unwrap();
    // The side channel's thread makes the queue pair, and says so.
    assert!(readable(fd, 5000));
    match a.t.poll_completion().map(|c| c.result) {
        Some(Err(VerbsError::Verb { verb, errno, peer })) => {
            assert_eq!((verb, errno), (Verb::CreateQp, libc::ENOMEM));
            assert_eq!(peer.as_deref(), Some(b.t.session_id()));
        }
        other => panic!("{other:?}"),
    }
    a.t.with_device_mut(|d| d.create_errno = None);
    a.write(0, 10, &b, 0, 2).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
}
