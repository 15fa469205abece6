//! The transport on a real RDMA device: two transports on the device named
//! by `FERRY_VERBS_DEVICE` connect through the NIC (RC loopback), write
//! and read random sizes that are checked byte by byte, and see a peer
//! that goes away fail its writes. They need a device, so they are ignored unless
//! asked for (`-- --ignored`), and then fail, saying why, without one.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{Completion, FaultKind, ReadOp, Region, Transport};
use tensorferry_verbs::{VerbsConfig, VerbsError, VerbsTransport};

mod support;
use support::write_op;

fn device() -> String {
    tensorferry_verbs::require_test_device()
}

struct Node {
    t: VerbsTransport,
    region: Region,
}

fn open(dev: &str) -> Node {
    let mut c = VerbsConfig::new(dev);
    c.write_timeout = Duration::from_secs(3);
    if let Ok(i) = std::env::var("FERRY_GID_INDEX") {
        c.gid =
            tensorferry_verbs::GidChoice::Index(i.parse().expect("FERRY_GID_INDEX is a number"));
    }
    c.listen = std::env::var("FERRY_VERBS_LISTEN").ok();
    let mut t = VerbsTransport::with_pool(&c, 64 << 20).expect("open the device");
    // SAFETY: the pool belongs to the transport and outlives its
    // registration.
    #[allow(unsafe_code)]
    let region = unsafe { t.register(t.pool_ptr(), t.pool_len()) }.expect("register the pool");
    Node { t, region }
}

/// Two nodes on the device under test.
fn pair() -> (Node, Node) {
    let dev = device();
    (open(&dev), open(&dev))
}

fn wait(t: &mut VerbsTransport, n: usize) -> Vec<Completion<VerbsError>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    while out.len() < n {
        match t.poll_completion() {
            Some(c) => out.push(c),
            None => {
                assert!(
                    Instant::now() < deadline,
                    "{} of {n} completions",
                    out.len()
                );
                std::thread::yield_now();
            }
        }
    }
    out
}

/// Both nodes' pools, as bytes.
///
/// # Safety
///
/// No transfer into or out of either pool may be in flight while the
/// slices are used, and they must not outlive the nodes.
#[allow(unsafe_code)]
unsafe fn pools<'a>(a: &Node, b: &Node) -> (&'a mut [u8], &'a mut [u8]) {
    // SAFETY: each pool is mapped for its length while its transport
    // lives; the caller keeps transfers away.
    unsafe {
        (
            std::slice::from_raw_parts_mut(a.t.pool_ptr(), a.t.pool_len()),
            std::slice::from_raw_parts_mut(b.t.pool_ptr(), b.t.pool_len()),
        )
    }
}

/// A xorshift64 generator started at `x`: random sizes and bytes that a
/// failing round reproduces.
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Up to 8 random spans of at most `max` bytes that lie one after the
/// other in `room` bytes: (where each is taken from, anywhere in `room`;
/// its length; where it goes, after the one before).
fn spans(next: &mut impl FnMut() -> u64, max: u64, room: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0u64;
    while out.len() < 8 {
        let n = 1 + next() % max;
        if at + n > room {
            break;
        }
        out.push((next() % (room - n + 1), n, at));
        at += n;
    }
    out
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release -p tensorferry-verbs --test device -- --ignored"]
fn random_writes_through_the_nic_arrive_byte_exact() {
    let (mut a, b) = pair();
    let len = a.t.pool_len();
    // SAFETY: each pool is only touched here while no write is in flight.
    #[allow(unsafe_code)]
    let (src, dst) = unsafe { pools(&a, &b) };
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for b in src.iter_mut() {
        *b = next() as u8;
    }
    for round in 0..50u64 {
        let writes = spans(&mut next, 8 << 20, len as u64);
        for (i, &(s, n, d)) in writes.iter().enumerate() {
            let cookie = round * 100 + i as u64;
            let op = write_op(a.region, s, n, b.t.session_id(), b.region.addr + d, cookie);
            a.t.post_write(&op).expect("post");
        }
        for c in wait(&mut a.t, writes.len()) {
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        for &(s, n, d) in &writes {
            let (s, n, d) = (s as usize, n as usize, d as usize);
            assert!(
                src[s..s + n] == dst[d..d + n],
                "round {round}: {n} bytes at {d}"
            );
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release -p tensorferry-verbs --test device -- --ignored"]
fn a_peer_that_goes_away_fails_its_writes_in_time() {
    let (mut a, b) = pair();
    let (peer, addr) = (b.t.session_id().to_owned(), b.region.addr);
    a.t.post_write(&write_op(a.region, 0, 4096, &peer, addr, 1))
        .unwrap();
    assert!(wait(&mut a.t, 1)[0].result.is_ok());
    drop(b);
    let t0 = Instant::now();
    a.t.post_write(&write_op(a.region, 0, 1 << 20, &peer, addr, 2))
        .unwrap();
    let c = wait(&mut a.t, 1).remove(0);
    let e = c.result.expect_err("the peer's QP is gone");
    assert!(
        matches!(e.kind(), FaultKind::PeerGone | FaultKind::Timeout),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release -p tensorferry-verbs --test device -- --ignored"]
fn random_reads_mixed_with_writes_through_the_nic_arrive_byte_exact() {
    let (mut a, b) = pair();
    let len = a.t.pool_len();
    let half = len / 2;
    // SAFETY: each pool is only touched here while no transfer is in
    // flight.
    #[allow(unsafe_code)]
    let (mine, theirs) = unsafe { pools(&a, &b) };
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    for byte in theirs.iter_mut().chain(mine[..half].iter_mut()) {
        *byte = next() as u8;
    }
    for round in 0..20u64 {
        // Reads from the peer's first half into our second half; a write
        // from our first half into the peer's second half after each, so
        // that reads and writes share the queue pair (and the fence).
        let reads = spans(&mut next, 2 << 20, half as u64);
        for (i, &(src, n, dst)) in reads.iter().enumerate() {
            let cookie = round * 100 + 2 * i as u64;
            a.t.post_read(&ReadOp {
                region: a.region,
                local_offset: half as u64 + dst,
                len: n,
                src_session: b.t.session_id(),
                src_addr: b.region.addr + src,
                cookie,
            })
            .expect("post a read");
            let to = b.region.addr + half as u64 + dst;
            a.t.post_write(&write_op(
                a.region,
                dst,
                n,
                b.t.session_id(),
                to,
                cookie + 1,
            ))
            .expect("post a write");
        }
        let mut done = wait(&mut a.t, 2 * reads.len());
        done.sort_by_key(|c| c.cookie);
        for (i, c) in done.iter().enumerate() {
            assert_eq!(c.cookie, round * 100 + i as u64, "each with its own cookie");
            assert!(c.result.is_ok(), "{:?}", c.result);
        }
        for &(src, n, dst) in &reads {
            let (src, n, dst) = (src as usize, n as usize, dst as usize);
            assert!(
                mine[half + dst..half + dst + n] == theirs[src..src + n],
                "round {round}: {n} bytes read from {src}"
            );
            assert!(
                theirs[half + dst..half + dst + n] == mine[dst..dst + n],
                "round {round}: {n} bytes written to {}",
                half + dst
            );
        }
    }
}
