//! Two transports in one process over real libfabric providers
//! (`tcp;ofi_rxm` on loopback and `shm`): writes land byte-exact, reads
//! bring the peer's bytes, the completion levels mean what they claim,
//! and bad input fails typed.

use std::time::{Duration, Instant};

use std::collections::HashMap;

use tensorferry_core::transport::{Fault, FaultKind, ReadOp, Region, Transport, WriteOp, WriteTag};
use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

fn config(provider: &str, delivery: DeliveryMode) -> FabricConfig {
    // Before this test's first libfabric call: removing a peer ends its
    // writes, so that an ended write's completion is final (the tests of
    // timed-out and cancelled writes rely on it).
    std::env::set_var("FI_AV_REMOVE_CLEANUP", "1");
    let mut c = FabricConfig::new(Provider::Named(provider.into()));
    c.delivery = delivery;
    if provider.starts_with("tcp") {
        c.source = Some("127.0.0.1".into());
    }
    c
}

fn open(provider: &str, delivery: DeliveryMode, pool: usize) -> (FabricTransport, Region) {
    let mut t = FabricTransport::with_pool(&config(provider, delivery), pool)
        .unwrap_or_else(|e| panic!("open {provider}: {e}"));
    let (p, n) = (t.pool_ptr(), t.pool_len());
    // SAFETY: the pool belongs to the transport and outlives its
    // registration.
    #[allow(unsafe_code)]
    let region = unsafe { t.register(p, n) }.expect("register the pool");
    (t, region)
}

fn pool(t: &FabricTransport) -> &[u8] {
    // SAFETY: tests read a pool only while no write into it is in flight.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts(t.pool_ptr(), t.pool_len())
    }
}

fn pool_mut(t: &mut FabricTransport) -> &mut [u8] {
    // SAFETY: tests fill a pool only while no write from it is in flight,
    // from the one thread that holds the transport mutably.
    #[allow(unsafe_code)]
    unsafe {
        std::slice::from_raw_parts_mut(t.pool_ptr(), t.pool_len())
    }
}

fn wait_completion(
    t: &mut FabricTransport,
    cookie: u64,
    within: Duration,
) -> Option<Result<(), tensorferry_fabric::FabricError>> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(c) = t.poll_completion() {
            assert_eq!(c.cookie, cookie);
            return Some(c.result);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    None
}

/// Posts with `post` and waits for its completion, again while it times
/// out (five tries at most): the tests of timed-out transfers keep the
/// write timeout short, and a busy host may take longer than that to
/// connect to the peer.
fn reach(
    t: &mut FabricTransport,
    cookie: u64,
    post: impl Fn(&mut FabricTransport) -> Result<(), tensorferry_fabric::FabricError>,
) {
    for attempt in 1.. {
        post(t).expect("post");
        match wait_completion(t, cookie, Duration::from_secs(10)).expect("an outcome in time") {
            Ok(()) => return,
            Err(e) if e.kind() == FaultKind::Timeout && attempt < 5 => continue,
            Err(e) => panic!("the peer is not reached: {e}"),
        }
    }
}

/// Waits for the receiver to report the write tagged `tag` landed (at
/// once where completions mean delivery: nothing is reported there). The
/// tests have one write in flight, so any other report is a fault.
fn wait_landed(t: &mut FabricTransport, tag: WriteTag, within: Duration) -> bool {
    if t.capabilities().delivery_complete {
        return true;
    }
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(landed) = t.poll_landed() {
            assert!(landed.matches(tag), "{landed:?} reported, {tag:?} awaited");
            return true;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    false
}

/// xorshift, so that failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn round_trip(provider: &str, delivery: DeliveryMode, max_chunk: u64) {
    let mut cfg = config(provider, delivery);
    cfg.max_chunk = max_chunk;
    let mut a = FabricTransport::with_pool(&cfg, 8 << 20).expect("open sender");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let (mut b, _) = open(provider, delivery, 8 << 20);
    assert_eq!(a.opened().delivery, b.opened().delivery);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ max_chunk);
    let base = b.pool_ptr() as u64;
    for i in 0..200u64 {
        let len = 1 + rng.next() % (4 << 20);
        let src = rng.next() % ((8 << 20) - len + 1);
        let dst = rng.next() % ((8 << 20) - len + 1);
        let fill = rng.next() as u8;
        for (k, byte) in pool_mut(&mut a)[src as usize..(src + len) as usize]
            .iter_mut()
            .enumerate()
        {
            *byte = fill.wrapping_add(k as u8).wrapping_mul(31);
        }
        let tag = WriteTag::of(&format!("req-{i}"), base + dst);
        a.post_write(&WriteOp {
            region: ra,
            local_offset: src,
            len,
            dest_session: b.session_id(),
            dest_addr: base + dst,
            tag,
            cookie: i,
        })
        .expect("post");
        let r = wait_completion(&mut a, i, Duration::from_secs(20)).expect("completion in time");
        r.expect("write succeeds");
        assert!(
            wait_landed(&mut b, tag, Duration::from_secs(20)),
            "write {i} landed"
        );
        assert_eq!(
            &pool(&b)[dst as usize..(dst + len) as usize],
            &pool(&a)[src as usize..(src + len) as usize],
            "write {i}: {len} bytes from {src} to {dst}"
        );
    }
}

#[test]
fn tcp_writes_land_byte_exact_in_both_delivery_modes() {
    round_trip("tcp;ofi_rxm", DeliveryMode::Complete, 0);
    round_trip("tcp;ofi_rxm", DeliveryMode::Notify, 0);
    round_trip("tcp;ofi_rxm", DeliveryMode::Notify, 256 << 10);
}

#[test]
fn shm_writes_land_byte_exact() {
    round_trip("shm", DeliveryMode::Auto, 0);
    round_trip("shm", DeliveryMode::Notify, 300_000);
}

/// What each completion level guarantees, shown with a receiver that
/// stops driving its queue.
/// A connected sender and a receiver that has stopped driving its queue,
/// with 64 KiB of `fill` posted to it (tag 2, cookie 1).
fn write_to_a_stalled_receiver(
    delivery: DeliveryMode,
    fill: u8,
) -> (FabricTransport, FabricTransport) {
    let (mut a, ra) = open("tcp;ofi_rxm", delivery, 1 << 20);
    let (mut b, _) = open("tcp;ofi_rxm", delivery, 1 << 20);
    let base = b.pool_ptr() as u64;
    // Connect first, so that only the data is in question.
    a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 8,
        dest_session: b.session_id(),
        dest_addr: base,
        tag: WriteTag(1),
        cookie: 0,
    })
    .unwrap();
    wait_completion(&mut a, 0, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert!(wait_landed(&mut b, WriteTag(1), Duration::from_secs(10)));
    b.hold_progress(true);
    std::thread::sleep(Duration::from_millis(20));
    pool_mut(&mut a)[..65536].fill(fill);
    a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 65536,
        dest_session: b.session_id(),
        dest_addr: base,
        tag: WriteTag(2),
        cookie: 1,
    })
    .unwrap();
    (a, b)
}

/// A write to a receiver that stopped driving its queue, ended by
/// `cancel_transfers` or by the write timeout: its completion comes once the
/// provider has ended it, and its source is never read afterwards.
fn a_stalled_write_ends_before_it_is_reported(by_cancel: bool) {
    let len = 16usize << 20;
    let mut cfg = config("tcp;ofi_rxm", DeliveryMode::Complete);
    cfg.write_timeout = Duration::from_millis(if by_cancel { 5000 } else { 300 });
    let mut a = FabricTransport::with_pool(&cfg, len).expect("open");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Complete, len);
    let (to, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    let write = |cookie, len| WriteOp {
        region: ra,
        local_offset: 0,
        len,
        dest_session: &to,
        dest_addr: base,
        tag: WriteTag(cookie),
        cookie,
    };
    // Connected first, so that only the data is in question.
    reach(&mut a, 0, |a| a.post_write(&write(0, 8)));
    b.hold_progress(true);
    std::thread::sleep(Duration::from_millis(20));
    pool_mut(&mut a).fill(0x11);
    a.post_write(&write(1, len as u64)).unwrap();
    let e = if by_cancel {
        assert!(
            wait_completion(&mut a, 1, Duration::from_millis(300)).is_none(),
            "a receiver that does not drive its queue stalls the write"
        );
        a.cancel_transfers(&to)
            .expect("the provider ends the write");
        wait_completion(&mut a, 1, Duration::from_millis(50))
            .expect("its completion is queued when cancel_transfers returns")
            .expect_err("ended unfinished")
    } else {
        wait_completion(&mut a, 1, Duration::from_secs(10))
            .expect("reported once its time is up and it has ended")
            .expect_err("ended unfinished")
    };
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    // From here the source is the caller's again: new bytes in it must
    // never reach the receiver, whatever it places once it drives its
    // queue again (over tcp, bytes its kernel had received before the
    // connection closed may still be placed).
    pool_mut(&mut a).fill(0x22);
    b.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !pool(&b).contains(&0x22),
        "a byte of the source was read after the write was reported"
    );
    // The peer is reached anew.
    reach(&mut a, 2, |a| a.post_write(&write(2, 4096)));
    assert!(pool(&b)[..4096].iter().all(|&x| x == 0x22));
}

#[test]
fn a_cancelled_write_to_a_stalled_receiver_reads_its_source_no_more() {
    a_stalled_write_ends_before_it_is_reported(true);
}

#[test]
fn a_timed_out_write_to_a_stalled_receiver_reads_its_source_no_more() {
    a_stalled_write_ends_before_it_is_reported(false);
}

#[test]
fn a_local_completion_is_not_delivery_but_notices_and_delivery_complete_are() {
    // Remote CQ data: the sender's completion can come before the bytes
    // are placed, so the receiver must wait for its notices.
    let (mut a, mut b) = write_to_a_stalled_receiver(DeliveryMode::Notify, 0xab);
    let done = wait_completion(&mut a, 1, Duration::from_secs(2));
    assert!(
        matches!(done, Some(Ok(()))),
        "tcp reports the write complete: {done:?}"
    );
    assert!(
        b.poll_landed().is_none(),
        "no notice while the receiver is stalled"
    );
    assert!(
        pool(&b)[..65536].iter().any(|&x| x != 0xab),
        "the bytes are not there yet although the sender's write completed"
    );
    b.hold_progress(false);
    assert!(wait_landed(&mut b, WriteTag(2), Duration::from_secs(10)));
    assert!(pool(&b)[..65536].iter().all(|&x| x == 0xab));

    // Delivery complete: the sender's completion waits for the receiver.
    let (mut a, b) = write_to_a_stalled_receiver(DeliveryMode::Complete, 0xcd);
    assert!(
        wait_completion(&mut a, 1, Duration::from_millis(500)).is_none(),
        "no completion while the receiver has not placed the bytes"
    );
    b.hold_progress(false);
    wait_completion(&mut a, 1, Duration::from_secs(10))
        .expect("completes")
        .unwrap();
    assert!(pool(&b)[..65536].iter().all(|&x| x == 0xcd));
}

#[test]
fn bad_writes_fail_typed_and_name_what_is_wrong() {
    let (mut a, ra) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let base = b.pool_ptr() as u64;
    let s = b.session_id().to_owned();
    let e = a
        .post_write(&WriteOp {
            region: ra,
            local_offset: 0,
            len: 4096,
            dest_session: &s,
            dest_addr: base + (1 << 20) - 100,
            tag: WriteTag(0),
            cookie: 1,
        })
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let e = a
        .post_write(&WriteOp {
            region: ra,
            local_offset: (1 << 20) - 10,
            len: 4096,
            dest_session: &s,
            dest_addr: base,
            tag: WriteTag(0),
            cookie: 1,
        })
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let e = a
        .post_write(&WriteOp {
            region: ra,
            local_offset: 0,
            len: 1,
            dest_session: "shm:/x@0+10",
            dest_addr: base,
            tag: WriteTag(0),
            cookie: 1,
        })
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
    let other = s.replacen("tcp;ofi_rxm", "efa", 1);
    let e = a
        .post_write(&WriteOp {
            region: ra,
            local_offset: 0,
            len: 1,
            dest_session: &other,
            dest_addr: base,
            tag: WriteTag(0),
            cookie: 1,
        })
        .unwrap_err();
    assert!(e.to_string().contains("efa session"), "{e}");
    let e = a
        .post_write(&WriteOp {
            region: Region {
                id: 9,
                addr: 0,
                len: 1,
            },
            local_offset: 0,
            len: 1,
            dest_session: &s,
            dest_addr: base,
            tag: WriteTag(0),
            cookie: 1,
        })
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    // Nothing was posted, so nothing completes.
    assert!(a.poll_completion().is_none());
}

/// Posts `len` bytes from `offset` of `from` to `dest_addr` at `to` and
/// waits until they landed.
fn write_and_wait(
    a: &mut FabricTransport,
    b: &mut FabricTransport,
    from: Region,
    offset: u64,
    len: u64,
    dest_addr: u64,
    cookie: u64,
) {
    let tag = WriteTag(0x5eed ^ cookie);
    let session = b.session_id().to_owned();
    a.post_write(&WriteOp {
        region: from,
        local_offset: offset,
        len,
        dest_session: &session,
        dest_addr,
        tag,
        cookie,
    })
    .expect("post");
    wait_completion(a, cookie, Duration::from_secs(20))
        .expect("completion in time")
        .expect("write succeeds");
    assert!(
        wait_landed(b, tag, Duration::from_secs(20)),
        "write {cookie} landed"
    );
}

/// A transport registers any number of regions (memory the application
/// allocated among them), each addressable by peers through the session
/// id, and writes go from any of its regions into any of a peer's.
fn several_regions(provider: &str, delivery: DeliveryMode) {
    // Declared first, dropped last: they outlive their registrations.
    let mut app_src = vec![0u8; 1 << 16];
    let mut app_dst = vec![0u8; 1 << 16];
    let (mut a, ra) = open(provider, delivery, 1 << 20);
    let mut b = FabricTransport::with_pool(&config(provider, delivery), 1 << 20).expect("open");
    let half = b.pool_len() / 2;
    // SAFETY: the pool belongs to the transport; the vectors outlive both
    // transports (declared before them) and are read only once the writes
    // into them landed.
    #[allow(unsafe_code)]
    let (rb1, rb2, ra2) = unsafe {
        (
            b.register(b.pool_ptr(), half)
                .expect("register half the pool"),
            b.register(app_dst.as_mut_ptr(), app_dst.len())
                .expect("register an application buffer"),
            a.register(app_src.as_mut_ptr(), app_src.len())
                .expect("register a source buffer"),
        )
    };
    assert_ne!(rb1.id, rb2.id);
    let listed = tensorferry_fabric::Session::parse(b.session_id()).expect("own session parses");
    assert_eq!(listed.regions.len(), 2, "{}", b.session_id());

    // From the sender's pool into the application's buffer, and from the
    // sender's second region into the receiver's pool.
    pool_mut(&mut a)[..4000]
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u8 ^ 0x5a);
    write_and_wait(&mut a, &mut b, ra, 0, 4000, rb2.addr + 100, 1);
    app_src
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i as u8).wrapping_mul(7));
    write_and_wait(&mut a, &mut b, ra2, 512, 8192, rb1.addr + 4096, 2);
    assert_eq!(&app_dst[100..4100], &pool(&a)[..4000]);
    assert_eq!(&pool(&b)[4096..4096 + 8192], &app_src[512..512 + 8192]);

    // A write that spans the end of a region, or lies in none, is refused.
    let session = b.session_id().to_owned();
    for dest_addr in [rb1.addr + rb1.len - 10, rb1.addr + rb1.len + 4096] {
        let e = a
            .post_write(&WriteOp {
                region: ra,
                local_offset: 0,
                len: 100,
                dest_session: &session,
                dest_addr,
                tag: WriteTag(0),
                cookie: 9,
            })
            .unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
        assert!(e.to_string().contains("none of peer"), "{e}");
    }

    // Deregistered, a region leaves the session id; writes into it are
    // refused, the other region still takes them.
    b.deregister(rb2).expect("deregister");
    assert_eq!(
        b.deregister(rb2).unwrap_err().kind(),
        FaultKind::OutOfBounds
    );
    let listed = tensorferry_fabric::Session::parse(b.session_id()).expect("own session parses");
    assert_eq!(listed.regions.len(), 1);
    let session = b.session_id().to_owned();
    let e = a
        .post_write(&WriteOp {
            region: ra,
            local_offset: 0,
            len: 10,
            dest_session: &session,
            dest_addr: rb2.addr,
            tag: WriteTag(0),
            cookie: 9,
        })
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    write_and_wait(&mut a, &mut b, ra2, 0, 1000, rb1.addr, 3);
    assert_eq!(&pool(&b)[..1000], &app_src[..1000]);
    drop((a, b));
}

#[test]
fn several_regions_are_each_written_through_the_session_id() {
    several_regions("tcp;ofi_rxm", DeliveryMode::Notify);
    several_regions("tcp;ofi_rxm", DeliveryMode::Auto);
    several_regions("shm", DeliveryMode::Auto);
}

#[test]
fn a_write_to_a_peer_that_is_gone_fails_that_write_only() {
    let mut cfg = config("tcp;ofi_rxm", DeliveryMode::Auto);
    cfg.write_timeout = Duration::from_secs(3);
    let mut a = FabricTransport::with_pool(&cfg, 1 << 20).expect("open");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (c, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (gone, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    drop(b);
    let r = match a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 4096,
        dest_session: &gone,
        dest_addr: base,
        tag: WriteTag(0),
        cookie: 7,
    }) {
        Err(e) => Err(e),
        Ok(()) => wait_completion(&mut a, 7, Duration::from_secs(30)).expect("an outcome in time"),
    };
    let e = r.expect_err("the peer is gone");
    // rxm answers "try again" while it cannot connect, so an unreachable
    // peer shows as a write that never completes.
    assert!(
        matches!(e.kind(), FaultKind::PeerGone | FaultKind::Timeout),
        "{e}"
    );
    assert!(e.to_string().contains(&gone), "{e}");
    // The transport goes on working with other peers.
    let base_c = c.pool_ptr() as u64;
    a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 4096,
        dest_session: c.session_id(),
        dest_addr: base_c,
        tag: WriteTag(0),
        cookie: 8,
    })
    .unwrap();
    wait_completion(&mut a, 8, Duration::from_secs(10))
        .unwrap()
        .unwrap();
}

/// Fills `buf` with a pattern of `seed`: two different seeds differ at
/// nearly every byte, so bytes from the wrong operation show.
fn fill(buf: &mut [u8], seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    for chunk in buf.chunks_mut(8) {
        let v = rng.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

fn read_op(
    region: Region,
    local_offset: u64,
    len: u64,
    from: &str,
    src_addr: u64,
    cookie: u64,
) -> ReadOp<'_> {
    ReadOp {
        region,
        local_offset,
        len,
        src_session: from,
        src_addr,
        cookie,
    }
}

/// Reads of random lengths at random places of the peer's pool (one of
/// them empty) bring exactly the peer's bytes, and give the peer no
/// arrival notice: the one it reports afterwards is a write's.
fn reads_bring_the_peers_bytes(provider: &str, delivery: DeliveryMode, max_chunk: u64) {
    let mut cfg = config(provider, delivery);
    cfg.max_chunk = max_chunk;
    let mut a = FabricTransport::with_pool(&cfg, 8 << 20).expect("open reader");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    assert!(a.opened().reads, "{provider} offers reads");
    let (mut b, _) = open(provider, delivery, 8 << 20);
    let from = b.session_id().to_owned();
    let base = b.pool_ptr() as u64;
    let mut rng = Rng(0x51ed_270b_2771_5bd3 ^ max_chunk);
    for i in 0..60u64 {
        let len = if i == 7 {
            0
        } else {
            1 + rng.next() % (3 << 20)
        };
        let src = rng.next() % ((8 << 20) - len + 1);
        let dst = rng.next() % ((8 << 20) - len + 1);
        fill(&mut pool_mut(&mut b)[src as usize..(src + len) as usize], i);
        fill(
            &mut pool_mut(&mut a)[dst as usize..(dst + len) as usize],
            !i,
        );
        let before = pool(&a).to_vec();
        a.post_read(&read_op(ra, dst, len, &from, base + src, i))
            .expect("post");
        wait_completion(&mut a, i, Duration::from_secs(20))
            .expect("completion in time")
            .expect("read succeeds");
        assert_eq!(
            &pool(&a)[dst as usize..(dst + len) as usize],
            &pool(&b)[src as usize..(src + len) as usize],
            "read {i}: {len} bytes from {src} to {dst}"
        );
        assert_eq!(&pool(&a)[..dst as usize], &before[..dst as usize]);
        assert_eq!(
            &pool(&a)[(dst + len) as usize..],
            &before[(dst + len) as usize..],
            "read {i} wrote past its destination"
        );
    }
    // The peer was told of no read: the first arrival it reports is this
    // write's (wait_landed fails on any other).
    let tag = WriteTag(0xfeed);
    a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 4096,
        dest_session: &from,
        dest_addr: base,
        tag,
        cookie: 99,
    })
    .unwrap();
    wait_completion(&mut a, 99, Duration::from_secs(20))
        .unwrap()
        .unwrap();
    assert!(wait_landed(&mut b, tag, Duration::from_secs(20)));
    assert!(b.poll_landed().is_none(), "reads gave the peer notices");
}

#[test]
fn tcp_reads_bring_the_peers_bytes_in_both_delivery_modes() {
    reads_bring_the_peers_bytes("tcp;ofi_rxm", DeliveryMode::Complete, 0);
    reads_bring_the_peers_bytes("tcp;ofi_rxm", DeliveryMode::Notify, 0);
    reads_bring_the_peers_bytes("tcp;ofi_rxm", DeliveryMode::Notify, 256 << 10);
}

#[test]
fn shm_reads_bring_the_peers_bytes() {
    reads_bring_the_peers_bytes("shm", DeliveryMode::Auto, 0);
    reads_bring_the_peers_bytes("shm", DeliveryMode::Notify, 300_000);
}

/// Many reads and writes in flight at once, in both directions' worth of
/// slots, each with its own pattern: every cookie completes once, and at
/// its completion its own bytes are in place (a read's here; a write's at
/// the peer where completions mean delivery, at its notice otherwise).
fn reads_and_writes_in_one_batch(provider: &str, delivery: DeliveryMode) {
    const OPS: u64 = 96;
    const SLOT: u64 = 160 << 10;
    let mut cfg = config(provider, delivery);
    // Several chunks per op, so that chunks of reads and writes interleave.
    cfg.max_chunk = 48 << 10;
    let len = (OPS * SLOT) as usize;
    let mut a = FabricTransport::with_pool(&cfg, len).expect("open");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let mut b = FabricTransport::with_pool(&cfg, len).expect("open peer");
    let (p, n) = (b.pool_ptr(), b.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    unsafe { b.register(p, n) }.expect("register");
    let peer = b.session_id().to_owned();
    let base = b.pool_ptr() as u64;
    // Op i uses slot i on both sides, at a length of its own. Writes
    // carry seed i from here; reads bring seed 1000 + i from the peer.
    let op_len = |i: u64| SLOT - 1 - (i * 977) % (SLOT / 2);
    let is_read = |i: u64| i % 3 != 1;
    for i in 0..OPS {
        let at = (i * SLOT) as usize;
        let l = op_len(i) as usize;
        if is_read(i) {
            fill(&mut pool_mut(&mut b)[at..at + l], 1000 + i);
            fill(&mut pool_mut(&mut a)[at..at + l], 5000 + i);
        } else {
            fill(&mut pool_mut(&mut a)[at..at + l], i);
            fill(&mut pool_mut(&mut b)[at..at + l], 5000 + i);
        }
    }
    let mut tags = HashMap::new();
    for i in 0..OPS {
        let at = i * SLOT;
        if is_read(i) {
            a.post_read(&read_op(ra, at, op_len(i), &peer, base + at, i))
                .expect("post read");
        } else {
            let tag = WriteTag(0x1000 + i);
            tags.insert(tag, i);
            a.post_write(&WriteOp {
                region: ra,
                local_offset: at,
                len: op_len(i),
                dest_session: &peer,
                dest_addr: base + at,
                tag,
                cookie: i,
            })
            .expect("post write");
        }
    }
    let mut seen = vec![false; OPS as usize];
    let mut expect = vec![0u8; SLOT as usize];
    let end = Instant::now() + Duration::from_secs(60);
    let mut done = 0;
    while done < OPS {
        assert!(Instant::now() < end, "{done} of {OPS} completed in time");
        let Some(c) = a.poll_completion() else {
            std::thread::sleep(Duration::from_micros(50));
            continue;
        };
        let i = c.cookie;
        assert!(i < OPS, "unknown cookie {i}");
        assert!(!seen[i as usize], "cookie {i} completed twice");
        seen[i as usize] = true;
        done += 1;
        c.result.unwrap_or_else(|e| panic!("op {i} failed: {e}"));
        let (at, l) = ((i * SLOT) as usize, op_len(i) as usize);
        if is_read(i) {
            fill(&mut expect[..l], 1000 + i);
            assert!(
                pool(&a)[at..at + l] == expect[..l],
                "read {i}'s bytes are not all here at its completion"
            );
        } else if a.capabilities().delivery_complete {
            fill(&mut expect[..l], i);
            assert!(
                pool(&b)[at..at + l] == expect[..l],
                "write {i}'s bytes are not all at the peer at its completion"
            );
        }
    }
    if !a.capabilities().delivery_complete {
        let end = Instant::now() + Duration::from_secs(60);
        while !tags.is_empty() {
            assert!(Instant::now() < end, "{} writes never landed", tags.len());
            let Some(landed) = b.poll_landed() else {
                std::thread::sleep(Duration::from_micros(50));
                continue;
            };
            let tag = *tags
                .keys()
                .find(|t| landed.matches(**t))
                .unwrap_or_else(|| panic!("{landed:?} landed; no write of that tag waits"));
            let i = tags.remove(&tag).unwrap();
            let (at, l) = ((i * SLOT) as usize, op_len(i) as usize);
            fill(&mut expect[..l], i);
            assert!(
                pool(&b)[at..at + l] == expect[..l],
                "write {i}'s bytes are not all at the peer at its notice"
            );
        }
        assert!(b.poll_landed().is_none(), "reads gave the peer notices");
    }
    // Nothing strayed outside its slot on either side.
    for i in 0..OPS {
        let (at, l) = ((i * SLOT) as usize, op_len(i) as usize);
        assert!(
            pool(&a)[at + l..at + SLOT as usize].iter().all(|&x| x == 0),
            "slot {i} here written past its end"
        );
        assert!(
            pool(&b)[at + l..at + SLOT as usize].iter().all(|&x| x == 0),
            "slot {i} at the peer written past its end"
        );
    }
}

#[test]
fn tcp_reads_and_writes_in_one_batch_complete_each_cookie() {
    reads_and_writes_in_one_batch("tcp;ofi_rxm", DeliveryMode::Complete);
    reads_and_writes_in_one_batch("tcp;ofi_rxm", DeliveryMode::Notify);
}

#[test]
fn shm_reads_and_writes_in_one_batch_complete_each_cookie() {
    reads_and_writes_in_one_batch("shm", DeliveryMode::Auto);
    reads_and_writes_in_one_batch("shm", DeliveryMode::Notify);
}

/// A read whose source lies outside the peer's regions, or whose
/// destination lies outside this side's, is refused before anything is
/// posted.
fn bad_reads(provider: &str) {
    // Declared first, dropped last: it outlives its registration.
    let mut app = vec![0u8; 1 << 16];
    let (mut a, ra) = open(provider, DeliveryMode::Auto, 1 << 20);
    let (mut b, rb) = open(provider, DeliveryMode::Auto, 1 << 20);
    // SAFETY: `app` outlives both transports (declared before them).
    #[allow(unsafe_code)]
    let rb2 = unsafe { b.register(app.as_mut_ptr(), app.len()) }.expect("register");
    let s = b.session_id().to_owned();
    for (src_addr, len) in [
        (rb.addr + rb.len - 100, 4096),
        (rb.addr + rb.len + 4096, 1),
        (rb2.addr + rb2.len - 1, 2),
        (u64::MAX - 10, 100),
    ] {
        let e = a
            .post_read(&read_op(ra, 0, len, &s, src_addr, 1))
            .unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
        assert!(e.to_string().contains("none of peer"), "{e}");
    }
    for (offset, len) in [((1 << 20) - 10, 4096), (1 << 20, 1), (u64::MAX, 2)] {
        let e = a
            .post_read(&read_op(ra, offset, len, &s, rb.addr, 1))
            .unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    }
    let unknown = Region {
        id: 99,
        addr: 0,
        len: 1,
    };
    let e = a
        .post_read(&read_op(unknown, 0, 1, &s, rb.addr, 1))
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    // A deregistered region of the peer's leaves its session id, and reads
    // from it are refused.
    b.deregister(rb2).expect("deregister");
    let s = b.session_id().to_owned();
    let e = a
        .post_read(&read_op(ra, 0, 10, &s, rb2.addr, 1))
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let e = a
        .post_read(&read_op(ra, 0, 1, "shm:/x@0+10", rb.addr, 1))
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
    // Nothing was posted, so nothing completes; a read in bounds works.
    assert!(a.poll_completion().is_none());
    fill(&mut pool_mut(&mut b)[..1000], 3);
    a.post_read(&read_op(ra, 24, 1000, &s, rb.addr, 2)).unwrap();
    wait_completion(&mut a, 2, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert_eq!(&pool(&a)[24..1024], &pool(&b)[..1000]);
    drop((a, b));
}

#[test]
fn tcp_reads_out_of_bounds_are_refused_typed() {
    bad_reads("tcp;ofi_rxm");
}

#[test]
fn shm_reads_out_of_bounds_are_refused_typed() {
    bad_reads("shm");
}

/// A read from a peer that stopped driving its queue (over tcp the peer's
/// provider answers a read only while its queue is driven), ended by
/// `cancel_transfers` or by the write timeout: its completion comes once
/// the provider has ended it, and its destination never changes
/// afterwards, even once the peer drives its queue again.
fn a_stalled_read_ends_before_it_is_reported(by_cancel: bool) {
    let len = 16usize << 20;
    let mut cfg = config("tcp;ofi_rxm", DeliveryMode::Complete);
    cfg.write_timeout = Duration::from_millis(if by_cancel { 5000 } else { 300 });
    let mut a = FabricTransport::with_pool(&cfg, len).expect("open");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let (mut b, _) = open("tcp;ofi_rxm", DeliveryMode::Complete, len);
    let (from, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    pool_mut(&mut b).fill(0x33);
    // Connected first, so that only the data is in question.
    reach(&mut a, 0, |a| {
        a.post_read(&read_op(ra, 0, 8, &from, base, 0))
    });
    b.hold_progress(true);
    std::thread::sleep(Duration::from_millis(20));
    pool_mut(&mut a).fill(0x11);
    a.post_read(&read_op(ra, 0, len as u64, &from, base, 1))
        .unwrap();
    let e = if by_cancel {
        assert!(
            wait_completion(&mut a, 1, Duration::from_millis(300)).is_none(),
            "a peer that does not drive its queue stalls the read"
        );
        a.cancel_transfers(&from)
            .expect("the provider ends the read");
        wait_completion(&mut a, 1, Duration::from_millis(50))
            .expect("its completion is queued when cancel_transfers returns")
            .expect_err("ended unfinished")
    } else {
        wait_completion(&mut a, 1, Duration::from_secs(10))
            .expect("reported once its time is up and it has ended")
            .expect_err("ended unfinished")
    };
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert!(e.to_string().contains("read from"), "{e}");
    // From here the destination is the caller's again: whatever the peer
    // does once it drives its queue, none of its bytes may arrive.
    let after = pool(&a).to_vec();
    b.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pool(&a) == &after[..],
        "the destination changed after the read was reported"
    );
    assert!(!pool(&a).contains(&0x33), "a byte of the peer's arrived");
    // The peer is reached anew.
    reach(&mut a, 2, |a| {
        a.post_read(&read_op(ra, 0, 4096, &from, base, 2))
    });
    assert!(pool(&a)[..4096].iter().all(|&x| x == 0x33));
}

#[test]
fn a_cancelled_read_from_a_stalled_peer_writes_its_destination_no_more() {
    a_stalled_read_ends_before_it_is_reported(true);
}

#[test]
fn a_timed_out_read_from_a_stalled_peer_writes_its_destination_no_more() {
    a_stalled_read_ends_before_it_is_reported(false);
}

#[test]
fn a_read_from_a_peer_that_is_gone_fails_that_read_only() {
    let mut cfg = config("tcp;ofi_rxm", DeliveryMode::Auto);
    cfg.write_timeout = Duration::from_secs(3);
    let mut a = FabricTransport::with_pool(&cfg, 1 << 20).expect("open");
    let (p, n) = (a.pool_ptr(), a.pool_len());
    // SAFETY: the transport's own pool.
    #[allow(unsafe_code)]
    let ra = unsafe { a.register(p, n) }.expect("register");
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (mut c, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (gone, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    drop(b);
    let r = match a.post_read(&read_op(ra, 0, 4096, &gone, base, 7)) {
        Err(e) => Err(e),
        Ok(()) => wait_completion(&mut a, 7, Duration::from_secs(30)).expect("an outcome in time"),
    };
    let e = r.expect_err("the peer is gone");
    // rxm answers "try again" while it cannot connect, so an unreachable
    // peer shows as a read that never completes.
    assert!(
        matches!(e.kind(), FaultKind::PeerGone | FaultKind::Timeout),
        "{e}"
    );
    assert!(e.to_string().contains(&gone), "{e}");
    // The transport goes on reading from other peers.
    fill(&mut pool_mut(&mut c)[..4096], 8);
    let from = c.session_id().to_owned();
    a.post_read(&read_op(ra, 0, 4096, &from, c.pool_ptr() as u64, 8))
        .unwrap();
    wait_completion(&mut a, 8, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert_eq!(&pool(&a)[..4096], &pool(&c)[..4096]);
}

/// Over `shm` a read is made by the reader itself, with
/// `process_vm_readv` inside `fi_readmsg` (libfabric 1.17's fast RMA), so
/// a posted read is done when the call returns and cannot stall inside
/// the provider. What a peer that stops driving its queue does stall is
/// what comes after: each read leaves it a note in its command queue, and
/// once that is full the provider refuses more ("try again"), so later
/// reads wait in this side's queue. Those are ended by
/// `cancel_transfers`, and their destination never changes afterwards.
#[test]
fn shm_reads_stalled_by_a_peer_whose_queue_is_full_end_on_cancel() {
    const READS: u64 = 3000;
    const LEN: u64 = 1024;
    let (mut a, ra) = open("shm", DeliveryMode::Auto, (READS * LEN) as usize);
    let (mut b, _) = open("shm", DeliveryMode::Auto, 1 << 20);
    let (from, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    pool_mut(&mut b).fill(0x33);
    // Connected first, so that only the data is in question.
    a.post_read(&read_op(ra, 0, 8, &from, base, 0)).unwrap();
    wait_completion(&mut a, 0, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    b.hold_progress(true);
    std::thread::sleep(Duration::from_millis(20));
    pool_mut(&mut a).fill(0x11);
    for i in 1..READS {
        a.post_read(&read_op(ra, i * LEN, LEN, &from, base, i))
            .unwrap();
    }
    // Completions come until the peer's queue is full, then stop.
    let mut done = vec![false; READS as usize];
    let next = |a: &mut FabricTransport| {
        let end = Instant::now() + Duration::from_millis(300);
        while Instant::now() < end {
            if let Some(c) = a.poll_completion() {
                return Some(c);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        None
    };
    while let Some(c) = next(&mut a) {
        c.result
            .expect("a read done before the peer's queue filled");
        done[c.cookie as usize] = true;
    }
    assert!(
        done[1..].iter().any(|&d| !d),
        "a peer that does not drive its queue stalls reads"
    );
    a.cancel_transfers(&from).expect("the reads end");
    // Every read not reported yet is now (a busy host may have let a few
    // more through before the cancel): ended ones failed with Timeout.
    let mut stalled = Vec::new();
    while let Some(c) = a.poll_completion() {
        assert!(!done[c.cookie as usize], "cookie {} twice", c.cookie);
        done[c.cookie as usize] = true;
        if let Err(e) = c.result {
            assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
            stalled.push(c.cookie);
        }
    }
    assert!(
        done[1..].iter().all(|&d| d),
        "each completion is queued when cancel_transfers returns"
    );
    assert!(!stalled.is_empty(), "the cancel ended stalled reads");
    let after = pool(&a).to_vec();
    for &i in &stalled {
        let at = (i * LEN) as usize;
        assert!(after[at..at + LEN as usize].iter().all(|&x| x == 0x11));
    }
    b.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pool(&a) == &after[..],
        "a destination changed after its read was reported"
    );
    // The peer is reached anew.
    a.post_read(&read_op(ra, 0, 4096, &from, base, READS))
        .unwrap();
    wait_completion(&mut a, READS, Duration::from_secs(10))
        .unwrap()
        .unwrap();
    assert!(pool(&a)[..4096].iter().all(|&x| x == 0x33));
}
