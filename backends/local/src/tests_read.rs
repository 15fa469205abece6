//! One-sided reads: from another process's registered memory (this test
//! binary run again as the peer), and through the `Transport` seam mixed
//! with writes, cancelled, and made before a deregistration.
// `Transport::register` is unsafe by its contract (registering memory
// hands its lifetime to the caller); nothing here dereferences.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};

use tensorferry_core::transport::{FaultKind, ReadOp, Region, Transport, WriteOp, WriteTag};

use super::tests::refused_range;
use super::*;

/// Set in the environment of the peer process this binary runs.
const PEER_ENV: &str = "FERRY_LOCAL_READ_PEER";
/// The line the peer prints once its memory is registered.
const PEER_LINE: &str = "FERRY-LOCAL-PEER";
/// What the peer registers: large enough to be read over the threads.
const PEER_LEN: usize = 24 << 20;

fn peer_byte(i: usize) -> u8 {
    (i * 13 + 5) as u8 ^ (i >> 16) as u8
}

fn engine() -> LocalEngine {
    LocalEngine::open(LocalConfig::default()).unwrap()
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

fn op(src: u64, dst: u64, len: u64) -> Op {
    Op { src, dst, len }
}

/// The peer process: registers `PEER_LEN` bytes of `peer_byte`, says
/// where, and stays until its stdin closes.
#[test]
#[ignore = "the peer process of the cross-process read test, which runs it"]
fn peer_process() {
    if std::env::var_os(PEER_ENV).is_none() {
        return;
    }
    let e = engine();
    let memory: Vec<u8> = (0..PEER_LEN).map(peer_byte).collect();
    crate::tests::reg(&e, addr(&memory), PEER_LEN as u64).unwrap();
    println!(
        "{PEER_LINE} {} {} {}",
        e.session_id(),
        addr(&memory),
        PEER_LEN
    );
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(e);
    drop(memory);
}

/// A peer process, killed and reaped on drop if still running.
struct Peer {
    child: Child,
    /// Kept open, so that what the harness prints as the peer ends does
    /// not fail on a closed pipe (it fits the pipe's buffer).
    _stdout: Option<BufReader<ChildStdout>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs this test binary as a peer; returns it with its session id and
/// the address of its registered memory.
fn spawn_peer() -> (Peer, String, u64) {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "tests_read::peer_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut peer = Peer {
        child,
        _stdout: None,
    };
    let mut stdout = BufReader::new(peer.child.stdout.take().unwrap());
    let mut line = String::new();
    while stdout.read_line(&mut line).unwrap() > 0 {
        // The harness may have printed the test's name on the same line.
        if let Some((_, rest)) = line.split_once(PEER_LINE) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(f[2], PEER_LEN.to_string(), "{line}");
            let (session, base) = (f[0].to_owned(), f[1].parse().unwrap());
            peer._stdout = Some(stdout);
            return (peer, session, base);
        }
        line.clear();
    }
    panic!("the peer process ended before registering its memory");
}

#[test]
fn reads_from_another_process_land_byte_for_byte_and_fail_once_it_exits() {
    let (mut peer, session, base) = spawn_peer();
    let a = engine();
    let mut sink = vec![0u8; PEER_LEN];
    crate::tests::reg(&a, addr(&sink), PEER_LEN as u64).unwrap();
    let want: Vec<u8> = (0..PEER_LEN).map(peer_byte).collect();
    // Large: spread over the copy threads.
    a.read(&session, &[op(base, addr(&sink), PEER_LEN as u64)])
        .unwrap();
    assert!(sink == want, "the bytes read differ from the peer's");
    // A batch of small ones, in one call, each to its own place.
    sink.fill(0);
    let ops: Vec<Op> = (0..2000u64)
        .map(|i| op(base + i * 1000, addr(&sink) + 3_000_000 + i * 97, 97))
        .collect();
    a.read(&session, &ops).unwrap();
    for i in 0..2000usize {
        let at = 3_000_000 + i * 97;
        assert_eq!(sink[at..at + 97], want[i * 1000..i * 1000 + 97], "read {i}");
    }
    // Outside the peer's regions, and outside this engine's.
    sink.fill(0);
    let e = a
        .read(&session, &[op(base + 8, addr(&sink), PEER_LEN as u64)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("peer read"), "{e}");
    assert_eq!(e.kind(), FaultKind::OutOfBounds);
    let e = a
        .read(&session, &[op(base, addr(&sink) + 8, PEER_LEN as u64)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("own read"), "{e}");
    assert_eq!(e.kind(), FaultKind::OutOfBounds);
    assert!(sink.iter().all(|&b| b == 0), "a refused read copied bytes");
    // The peer exits: a read from it, by the engine that knows it and by
    // one that attaches anew, is refused as gone.
    drop(peer.child.stdin.take());
    assert!(peer.child.wait().unwrap().success());
    let e = a.read(&session, &[op(base, addr(&sink), 64)]).unwrap_err();
    assert!(matches!(e, LocalError::PeerGone { .. }), "{e}");
    assert_eq!(e.kind(), FaultKind::PeerGone);
    let b = engine();
    crate::tests::reg(&b, addr(&sink), PEER_LEN as u64).unwrap();
    let e = b.read(&session, &[op(base, addr(&sink), 64)]).unwrap_err();
    assert_eq!(e.kind(), FaultKind::PeerGone, "{e}");
    assert!(sink.iter().all(|&b| b == 0));
}

#[test]
fn reads_in_one_process_are_checked_on_both_sides() {
    let (a, b) = (engine(), engine());
    let theirs: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
    let mine = vec![0u8; 4096];
    crate::tests::reg(&a, addr(&mine), 4096).unwrap();
    crate::tests::reg(&b, addr(&theirs), 4096).unwrap();
    // Zero bytes: nothing checked, nothing copied, as for a write.
    a.read(b.session_id(), &[op(0, 0, 0)]).unwrap();
    a.read(b.session_id(), &[op(addr(&theirs), addr(&mine), 4096)])
        .unwrap();
    assert!(mine == theirs);
    // A read's source is the peer's: this engine's own memory is not a
    // source, nor the peer's beyond its region.
    let e = a
        .read(b.session_id(), &[op(addr(&mine), addr(&mine), 16)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("peer read"), "{e}");
    assert!(e.to_string().starts_with("read of 16 bytes from"), "{e}");
    // A read's destination is this engine's: the peer's is not.
    let e = a
        .read(b.session_id(), &[op(addr(&theirs), addr(&theirs), 16)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("own read"), "{e}");
    assert!(e.to_string().starts_with("read of 16 bytes into"), "{e}");
    // Deregistered at the peer: refused.
    b.deregister(addr(&theirs)).unwrap();
    let e = a
        .read(b.session_id(), &[op(addr(&theirs), addr(&mine), 16)])
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
}

/// Two transports with two regions each, filled with distinct bytes.
struct Pair {
    a: LocalTransport,
    b: LocalTransport,
    /// `a`'s: written from (`src`) and read into (`sink`).
    src: Vec<u8>,
    sink: Vec<u8>,
    /// `b`'s: written into (`dst`) and read from (`pool`).
    dst: Vec<u8>,
    pool: Vec<u8>,
    regions: [Region; 4],
}

const PAIR_LEN: usize = 1 << 16;

impl Pair {
    fn new() -> Self {
        let mut p = Self {
            a: LocalTransport::open(LocalConfig::default()).unwrap(),
            b: LocalTransport::open(LocalConfig::default()).unwrap(),
            src: (0..PAIR_LEN).map(|i| (i * 3 + 1) as u8).collect(),
            sink: vec![0; PAIR_LEN],
            dst: vec![0; PAIR_LEN],
            pool: (0..PAIR_LEN).map(|i| (i * 11 + 7) as u8 | 1).collect(),
            regions: [Region {
                id: 0,
                addr: 0,
                len: 0,
            }; 4],
        };
        // SAFETY: the vectors live as long as the transports (both in
        // `Pair`, deregistered in `finish`), and the tests look at them
        // only when no copy into them is posted.
        unsafe {
            p.regions = [
                p.a.register(p.src.as_mut_ptr(), PAIR_LEN).unwrap(),
                p.a.register(p.sink.as_mut_ptr(), PAIR_LEN).unwrap(),
                p.b.register(p.dst.as_mut_ptr(), PAIR_LEN).unwrap(),
                p.b.register(p.pool.as_mut_ptr(), PAIR_LEN).unwrap(),
            ];
        }
        p
    }

    /// `a` reads `len` bytes from the start of `b`'s `pool` into
    /// `region` at `offset`, as `cookie`.
    fn read_pool(
        &mut self,
        region: Region,
        offset: u64,
        len: u64,
        cookie: u64,
    ) -> Result<(), LocalError> {
        let from = self.regions[3].addr;
        self.a.post_read(&read(
            region,
            offset,
            len,
            self.b.session_id(),
            from,
            cookie,
        ))
    }

    fn finish(mut self) {
        let [src, sink, dst, pool] = self.regions;
        self.a.deregister(src).unwrap();
        self.a.deregister(sink).unwrap();
        self.b.deregister(dst).unwrap();
        self.b.deregister(pool).unwrap();
    }
}

fn read(region: Region, offset: u64, len: u64, from: &str, src: u64, cookie: u64) -> ReadOp<'_> {
    ReadOp {
        region,
        local_offset: offset,
        len,
        src_session: from,
        src_addr: src,
        cookie,
    }
}

/// A write of `len` bytes at `offset` in `region` to `dst` in `to`
/// (shared with the transport's own tests).
pub(crate) fn write(
    region: Region,
    offset: u64,
    len: u64,
    to: &str,
    dst: u64,
    cookie: u64,
) -> WriteOp<'_> {
    WriteOp {
        region,
        local_offset: offset,
        len,
        dest_session: to,
        dest_addr: dst,
        tag: WriteTag(0),
        cookie,
    }
}

fn outcomes(t: &mut LocalTransport) -> Vec<(u64, Result<(), LocalError>)> {
    let mut all: Vec<_> = std::iter::from_fn(|| t.poll_completion())
        .map(|c| (c.cookie, c.result))
        .collect();
    all.sort_by_key(|o| o.0);
    all
}

/// Each outcome's cookie and, for a failure, its kind.
fn kinds_of(got: &[(u64, Result<(), LocalError>)]) -> Vec<(u64, Option<FaultKind>)> {
    got.iter()
        .map(|(c, r)| (*c, r.as_ref().err().map(LocalError::kind)))
        .collect()
}

#[test]
fn reads_and_writes_mixed_in_one_batch_complete_each_with_its_own_cookie() {
    let mut p = Pair::new();
    let [src, sink, dst, pool] = p.regions;
    let to = p.b.session_id().to_owned();
    let posted = [
        // Runs, in posting order: a write, four reads (one bad), two
        // writes (one bad). The first read reads what the write before it
        // wrote; each read's source is the peer's memory and its
        // destination `a`'s, so a read made as a write would fail its
        // checks and leave `sink` empty.
        (0, Some(write(src, 0, 4096, &to, dst.addr, 0))),
        (1, None),
        (2, None),
        (3, None),
        (4, None),
        (5, Some(write(src, 4096, 4096, &to, dst.addr + 8192, 5))),
        (6, Some(write(src, 0, 16, &to, dst.addr + dst.len, 6))),
    ];
    let reads = [
        read(sink, 0, 4096, &to, dst.addr, 1),
        read(sink, 4096, 4096, &to, pool.addr + 100, 2),
        read(sink, 8192, 64, &to, pool.addr + pool.len - 32, 3),
        read(sink, 12288, 512, &to, pool.addr, 4),
    ];
    for (cookie, w) in &posted {
        match w {
            Some(w) => p.a.post_write(w).unwrap(),
            None => p.a.post_read(&reads[*cookie as usize - 1]).unwrap(),
        }
    }
    // Posted, not made.
    assert!(p.sink.iter().all(|&x| x == 0));
    let got = outcomes(&mut p.a);
    let kinds = kinds_of(&got);
    let oob = Some(FaultKind::OutOfBounds);
    assert_eq!(
        kinds,
        vec![
            (0, None),
            (1, None),
            (2, None),
            (3, oob),
            (4, None),
            (5, None),
            (6, oob)
        ]
    );
    assert_eq!(
        got[3].1.as_ref().err().and_then(refused_range),
        Some("peer read")
    );
    assert_eq!(
        got[6].1.as_ref().err().and_then(refused_range),
        Some("peer write")
    );
    assert_eq!(p.dst[..4096], p.src[..4096], "write 0");
    assert_eq!(p.sink[..4096], p.src[..4096], "read 1 (after write 0)");
    assert_eq!(p.sink[4096..8192], p.pool[100..4196], "read 2");
    assert!(p.sink[8192..12288].iter().all(|&x| x == 0), "read 3");
    assert_eq!(p.sink[12288..12800], p.pool[..512], "read 4");
    assert_eq!(p.dst[8192..12288], p.src[4096..8192], "write 5");
    assert!(p.dst[4096..8192].iter().all(|&x| x == 0));
    p.finish();
}

#[test]
fn reads_outside_this_process_s_region_are_refused_when_posted() {
    let mut p = Pair::new();
    let sink = p.regions[1];
    for (offset, len) in [(PAIR_LEN as u64 - 8, 16), (u64::MAX, 2)] {
        let e = p.read_pool(sink, offset, len, 1).unwrap_err();
        assert_eq!(refused_range(&e), Some("own read"), "{e}");
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
    }
    // A region this transport did not register.
    let unknown = Region { id: 99, ..sink };
    let e = p.read_pool(unknown, 0, 16, 1).unwrap_err();
    assert_eq!(refused_range(&e), Some("own read"), "{e}");
    // Zero bytes at the region's end: posted, and completed as done.
    p.read_pool(sink, PAIR_LEN as u64, 0, 2).unwrap();
    let got = outcomes(&mut p.a);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 2);
    assert!(got[0].1.is_ok(), "{:?}", got[0].1);
    assert!(p.sink.iter().all(|&x| x == 0));
    p.finish();
}

#[test]
fn cancelled_reads_are_never_made_and_complete_as_timed_out() {
    let mut p = Pair::new();
    let [src, sink, dst, pool] = p.regions;
    let mut c = LocalTransport::open(LocalConfig::default()).unwrap();
    let mut other: Vec<u8> = (0..4096u32).map(|i| (i * 5 + 3) as u8 | 1).collect();
    // SAFETY: `other` outlives `c`'s registration (deregistered below).
    let rc = unsafe { c.register(other.as_mut_ptr(), other.len()) }.unwrap();
    let (sb, sc) = (p.b.session_id().to_owned(), c.session_id().to_owned());
    // Reads from b and c, and a write to b, stalled: posted, not polled.
    p.a.post_read(&read(sink, 0, 4096, &sb, pool.addr, 0))
        .unwrap();
    p.a.post_read(&read(sink, 4096, 4096, &sc, rc.addr, 1))
        .unwrap();
    p.a.post_write(&write(src, 0, 4096, &sb, dst.addr, 2))
        .unwrap();
    p.a.post_read(&read(sink, 8192, 4096, &sb, pool.addr, 3))
        .unwrap();
    p.a.cancel_transfers(&sb).unwrap();
    let got = outcomes(&mut p.a);
    let kinds = kinds_of(&got);
    let timeout = Some(FaultKind::Timeout);
    assert_eq!(
        kinds,
        vec![(0, timeout), (1, None), (2, timeout), (3, timeout)]
    );
    for (i, direction) in [(0, Direction::Read), (2, Direction::Write)] {
        assert!(
            matches!(&got[i].1, Err(LocalError::Cancelled { direction: d, .. }) if *d == direction),
            "{:?}",
            got[i].1
        );
    }
    let e = got[0].1.as_ref().unwrap_err().to_string();
    assert!(e.starts_with("read with peer session"), "{e}");
    // The other peer's read went on; b's never touched the destination,
    // nor does anything after the cancel.
    assert_eq!(p.sink[4096..8192], other[..]);
    assert!(p.a.poll_completion().is_none());
    assert!(
        p.sink[..4096].iter().all(|&x| x == 0),
        "a cancelled read was made"
    );
    assert!(
        p.sink[8192..].iter().all(|&x| x == 0),
        "a cancelled read was made"
    );
    assert!(p.dst.iter().all(|&x| x == 0), "a cancelled write was made");
    c.deregister(rc).unwrap();
    p.finish();
}

#[test]
fn deregister_makes_the_reads_posted_into_the_region_first() {
    let mut p = Pair::new();
    let sink = p.regions[1];
    p.read_pool(sink, 0, PAIR_LEN as u64, 9).unwrap();
    p.a.deregister(sink).unwrap();
    assert!(
        p.sink == p.pool,
        "deregister ended the region before its read"
    );
    let got = outcomes(&mut p.a);
    assert_eq!(got.len(), 1);
    assert!(got[0].1.is_ok(), "{:?}", got[0].1);
    // Registered again, for `finish` to end.
    // SAFETY: as in `Pair::new`.
    p.regions[1] = unsafe { p.a.register(p.sink.as_mut_ptr(), PAIR_LEN) }.unwrap();
    p.finish();
}
