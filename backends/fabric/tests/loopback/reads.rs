//! Reads: they bring the peer's bytes and give it no notice, in batches
//! with writes, refused out of bounds, from a peer that is gone.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{FaultKind, Region, Transport, WriteOp, WriteTag};
use tensorferry_fabric::DeliveryMode;

use super::{
    config, each_case, fails_as_gone, fill, open, open_chunked, open_with, pool, pool_mut, read_op,
    wait_completion, wait_landed, with_a_gone_peer, Rng,
};

/// Reads of random lengths at random places of the peer's pool (one of
/// them empty) bring exactly the peer's bytes, and give the peer no
/// arrival notice: the one it reports afterwards is a write's.
fn reads_bring_the_peers_bytes(provider: &str, delivery: DeliveryMode, max_chunk: u64) {
    let (mut a, ra) = open_chunked(provider, delivery, max_chunk, 8 << 20);
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
    each_case("tcp;ofi_rxm", reads_bring_the_peers_bytes);
}

#[test]
fn shm_reads_bring_the_peers_bytes() {
    each_case("shm", reads_bring_the_peers_bytes);
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
    let (mut a, ra) = open_with(&cfg, len);
    let (mut b, _) = open_with(&cfg, len);
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

#[test]
fn a_read_from_a_peer_that_is_gone_fails_that_read_only() {
    let (mut a, ra, (gone, base), mut c) = with_a_gone_peer();
    let posted = a.post_read(&read_op(ra, 0, 4096, &gone, base, 7));
    fails_as_gone(&mut a, posted, 7, &gone);
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
