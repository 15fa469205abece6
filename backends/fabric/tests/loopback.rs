//! Two transports in one process over real libfabric providers
//! (`tcp;ofi_rxm` on loopback and `shm`): writes land byte-exact, the
//! completion levels mean what they claim, and bad input fails typed.

use std::time::{Duration, Instant};

use ferry_core::transport::{Fault, FaultKind, Region, Transport, WriteOp, WriteTag};
use ferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

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
) -> Option<Result<(), ferry_fabric::FabricError>> {
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
    a.post_write(&write(0, 8)).unwrap();
    wait_completion(&mut a, 0, Duration::from_secs(10))
        .unwrap()
        .unwrap();
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
    a.post_write(&write(2, 4096)).unwrap();
    wait_completion(&mut a, 2, Duration::from_secs(10))
        .unwrap()
        .unwrap();
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
    let listed = ferry_fabric::Session::parse(b.session_id()).expect("own session parses");
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
    let listed = ferry_fabric::Session::parse(b.session_id()).expect("own session parses");
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
