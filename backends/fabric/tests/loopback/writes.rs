//! Writes: they land byte-exact, what each completion level guarantees,
//! keys and session ids, bad writes, several regions, a peer that is gone,
//! and a target that deregisters under a write.

use std::time::Duration;

use tensorferry_core::transport::{FaultKind, Region, Transport, WriteOp, WriteTag};
use tensorferry_fabric::{DeliveryMode, FabricTransport};

use super::{
    config, each_case, fails_as_gone, open, open_chunked, open_with, pool, pool_mut, reach,
    wait_completion, wait_landed, with_a_gone_peer, write_op, Rng,
};

fn round_trip(provider: &str, delivery: DeliveryMode, max_chunk: u64) {
    let (mut a, ra) = open_chunked(provider, delivery, max_chunk, 8 << 20);
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
    each_case("tcp;ofi_rxm", round_trip);
}

#[test]
fn shm_writes_land_byte_exact() {
    each_case("shm", round_trip);
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

/// A memory key is random and 64 bits wide where the provider takes
/// requested keys, and a one-region session id fits the 128 bytes a
/// coordinator keeps of one.
#[test]
fn keys_are_random_and_session_ids_fit_a_coordinators_names() {
    for provider in ["tcp;ofi_rxm", "shm"] {
        let (a, _) = open(provider, DeliveryMode::Complete, 1 << 20);
        let (b, _) = open(provider, DeliveryMode::Complete, 1 << 20);
        let key = |t: &FabricTransport| {
            let s = tensorferry_fabric::session::Session::parse(t.session_id()).unwrap();
            s.regions[0].key
        };
        assert_ne!(key(&a), key(&b), "{provider}");
        assert_ne!(key(&a), 1);
        assert!(
            a.session_id().len() <= 128,
            "{provider}: {} bytes: {}",
            a.session_id().len(),
            a.session_id()
        );
    }
}

#[test]
fn bad_writes_fail_typed_and_name_what_is_wrong() {
    let (mut a, ra) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let (b, _) = open("tcp;ofi_rxm", DeliveryMode::Auto, 1 << 20);
    let base = b.pool_ptr() as u64;
    let s = b.session_id().to_owned();
    // Each refused when posted, with its error.
    let refused =
        |a: &mut FabricTransport, region, local_offset, len, dest_session: &str, dest_addr| {
            a.post_write(&WriteOp {
                region,
                local_offset,
                len,
                dest_session,
                dest_addr,
                tag: WriteTag(0),
                cookie: 1,
            })
            .unwrap_err()
        };
    let e = refused(&mut a, ra, 0, 4096, &s, base + (1 << 20) - 100);
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let e = refused(&mut a, ra, (1 << 20) - 10, 4096, &s, base);
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let e = refused(&mut a, ra, 0, 1, "shm:/x@0+10", base);
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
    let other = s.replacen("tcp;ofi_rxm", "efa", 1);
    let e = refused(&mut a, ra, 0, 1, &other, base);
    assert!(e.to_string().contains("efa session"), "{e}");
    let e = refused(
        &mut a,
        Region {
            id: 9,
            addr: 0,
            len: 1,
        },
        0,
        1,
        &s,
        base,
    );
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
    let (mut a, ra, (gone, base), c) = with_a_gone_peer();
    let posted = a.post_write(&WriteOp {
        region: ra,
        local_offset: 0,
        len: 4096,
        dest_session: &gone,
        dest_addr: base,
        tag: WriteTag(0),
        cookie: 7,
    });
    fails_as_gone(&mut a, posted, 7, &gone);
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

/// A region deregistered while a peer's write into it is under way: once
/// `deregister` returns, no byte of the write is placed in its memory
/// (the memory is the caller's again, to free or reuse), however far the
/// write had come. The write is one message, so that the provider is in
/// the middle of placing it at some point of each try.
#[test]
fn once_a_target_deregisters_no_byte_of_a_peers_write_lands_in_its_memory() {
    let len = 64usize << 20;
    let cfg = config("tcp;ofi_rxm", DeliveryMode::Complete);
    let (mut a, ra) = open_with(&cfg, len);
    pool_mut(&mut a).fill(0x33);
    let (mut b, mut rb) = open("tcp;ofi_rxm", DeliveryMode::Complete, len);
    let to = b.session_id().to_owned();
    let base = b.pool_ptr() as u64;
    let write = |cookie, len| write_op(ra, &to, base, cookie, len);
    reach(&mut a, 0, |a| a.post_write(&write(0, 8)));
    let mut cut = 0;
    // Eight tries at least, more (up to 24) until one cut a write under
    // way: on a loaded machine the write may not have begun to land by
    // the deregistration of the first eight.
    for attempt in 1..=24u64 {
        if attempt > 8 && cut > 0 {
            break;
        }
        pool_mut(&mut b).fill(0);
        a.post_write(&write(attempt, len as u64)).expect("post");
        std::thread::sleep(Duration::from_millis(2 * ((attempt - 1) % 8 + 1)));
        b.deregister(rb).expect("deregister");
        let then = pool(&b).to_vec();
        let outcome = wait_completion(&mut a, attempt, Duration::from_secs(20))
            .expect("the write ends in time");
        std::thread::sleep(Duration::from_millis(100));
        let placed = then.iter().filter(|&&x| x == 0x33).count();
        assert!(
            pool(&b) == &then[..],
            "try {attempt}: bytes landed after deregister returned ({placed} placed before; the write {outcome:?})"
        );
        if outcome.is_err() && placed > 0 {
            cut += 1;
        }
        let (p, n) = (b.pool_ptr(), b.pool_len());
        // SAFETY: the transport's own pool, registered again.
        #[allow(unsafe_code)]
        {
            rb = unsafe { b.register(p, n) }.expect("register again");
        }
        // The peer is reached again, through the new region.
        let to2 = b.session_id().to_owned();
        reach(&mut a, 100 + attempt, |a| {
            a.post_write(&WriteOp {
                dest_session: &to2,
                ..write(100 + attempt, 8)
            })
        });
    }
    assert!(cut > 0, "no try cut a write under way");
}
