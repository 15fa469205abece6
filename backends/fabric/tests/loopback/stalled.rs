//! Transfers with a peer that stopped driving its queue, and how they
//! end: cancelled, timed out or deregistered, a stalled write reads its
//! source no more and a stalled read writes its destination no more; what
//! `shm` cannot end is held until the peer ends it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{FaultKind, Region, Transport};
use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport};

use super::{
    config, fill, open, open_with, pool, pool_mut, reach, read_op, wait_completion, write_op,
};

/// How a stalled write or read is ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    /// `cancel_transfers`.
    Cancel,
    /// Its deadline (the write timeout).
    Timeout,
    /// `deregister` of its local region.
    Deregister,
}

/// Ends the stalled op `cookie` with `peer` as `how` says, and returns
/// its error (after a deregistration, the region is re-registered, as
/// `region` returns it).
fn end_stalled(
    a: &mut FabricTransport,
    region: &mut Region,
    peer: &str,
    cookie: u64,
    how: End,
) -> Option<tensorferry_fabric::FabricError> {
    match how {
        End::Cancel | End::Deregister => assert!(
            wait_completion(a, cookie, Duration::from_millis(300)).is_none(),
            "a peer that does not drive its queue stalls the op"
        ),
        End::Timeout => {}
    }
    match how {
        End::Cancel => {
            a.cancel_transfers(peer).expect("the op is ended");
            Some(
                wait_completion(a, cookie, Duration::from_millis(50))
                    .expect("its completion is queued when cancel_transfers returns")
                    .expect_err("ended unfinished"),
            )
        }
        End::Timeout => Some(
            wait_completion(a, cookie, Duration::from_secs(10))
                .expect("reported once its time is up and it has ended")
                .expect_err("ended unfinished"),
        ),
        End::Deregister => {
            a.deregister(*region)
                .expect("deregister returns once nothing of the region moves");
            let e = wait_completion(a, cookie, Duration::from_millis(50))
                .expect("its completion is queued when deregister returns")
                .expect_err("ended unfinished");
            let (p, n) = (a.pool_ptr(), a.pool_len());
            // SAFETY: the transport's own pool.
            #[allow(unsafe_code)]
            let r = unsafe { a.register(p, n) }.expect("register again");
            *region = r;
            Some(e)
        }
    }
}

/// The config of a sender whose stalled ops end as `how` says: with a
/// short write timeout where the deadline ends them, a long one (that
/// does not run out first) elsewhere; completions mean delivery.
fn ending_as(provider: &str, how: End) -> FabricConfig {
    let mut cfg = config(provider, DeliveryMode::Complete);
    cfg.write_timeout = Duration::from_millis(match how {
        End::Timeout => 300,
        _ => 5000,
    });
    cfg
}

/// Runs `case` over `provider` once for each way a stalled op is ended,
/// printing each first so that a failing one names itself.
fn each_end(provider: &str, case: fn(&str, End)) {
    for how in [End::Cancel, End::Timeout, End::Deregister] {
        eprintln!("case: {provider}, {how:?}");
        case(provider, how);
    }
}

/// The sender of a stalled-op test, its stalled ops ending as `how` says
/// ([`ending_as`]), with a pool of `len` bytes registered. The tests
/// need libfabric's defaults, with no FI_AV_REMOVE_CLEANUP.
fn stalling_sender(provider: &str, how: End, len: usize) -> (FabricTransport, Region) {
    assert!(
        std::env::var_os("FI_AV_REMOVE_CLEANUP").is_none(),
        "the test runs without FI_AV_REMOVE_CLEANUP"
    );
    open_with(&ending_as(provider, how), len)
}

/// A write to a receiver that stopped driving its queue, ended as `how`
/// says: its completion comes once it has ended, and its source is never
/// read afterwards, whatever the receiver does once it drives its queue
/// again. A write to another peer, in flight meanwhile, is not disturbed.
/// No libfabric setting is needed for it.
fn a_stalled_write_ends_before_it_is_reported(provider: &str, how: End) {
    let len = 16usize << 20;
    let (mut a, mut ra) = stalling_sender(provider, how, len);
    let (b, _) = open(provider, DeliveryMode::Complete, len);
    let (c, _) = open(provider, DeliveryMode::Complete, len);
    let (to, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
    let (other, other_base) = (c.session_id().to_owned(), c.pool_ptr() as u64);
    // Connected first, so that only the data is in question.
    reach(&mut a, 0, |a| a.post_write(&write_op(ra, &to, base, 0, 8)));
    reach(&mut a, 10, |a| {
        a.post_write(&write_op(ra, &other, other_base, 10, 8))
    });
    b.hold_progress(true);
    std::thread::sleep(Duration::from_millis(20));
    pool_mut(&mut a).fill(0x11);
    a.post_write(&write_op(ra, &to, base, 1, len as u64))
        .unwrap();
    let e = end_stalled(&mut a, &mut ra, &to, 1, how).unwrap();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    // From here the source is the caller's again: new bytes in it must
    // never reach the receiver, whatever it places once it drives its
    // queue again (bytes it held already, in its kernel's socket buffer
    // over tcp or in the shared buffers over shm, may still be placed).
    pool_mut(&mut a).fill(0x22);
    b.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !pool(&b).contains(&0x22),
        "a byte of the source was read after the write was reported"
    );
    // Both peers are reached anew, by the same session id.
    reach(&mut a, 2, |a| {
        a.post_write(&write_op(ra, &to, base, 2, 4096))
    });
    assert!(pool(&b)[..4096].iter().all(|&x| x == 0x22));
    reach(&mut a, 11, |a| {
        a.post_write(&write_op(ra, &other, other_base, 11, 1 << 20))
    });
    assert!(pool(&c)[..1 << 20].iter().all(|&x| x == 0x22));
}

/// Over tcp: cancelled, timed out or with its source deregistered.
#[test]
fn a_write_to_a_stalled_receiver_reads_its_source_no_more_however_it_ends() {
    each_end("tcp;ofi_rxm", a_stalled_write_ends_before_it_is_reported);
}

/// Over libfabric 1.17's `shm` a write a peer has taken cannot be ended
/// by this side (the peer copies its bytes in its own time): given up on
/// a stopped peer, by a cancel, a deregistration or its deadline, it is
/// not reported, its region stays registered and `NotEnded` says why,
/// until the peer ends it. Only then is it reported (failed, as given up).
#[test]
fn over_shm_a_write_a_stopped_peer_took_is_held_until_the_peer_ends_it() {
    for how in [End::Cancel, End::Deregister, End::Timeout] {
        let len = 1usize << 20;
        let cfg = ending_as("shm", how);
        let mut a = FabricTransport::with_pool(&cfg, len).expect("open");
        assert!(!a.opened().ends_operations);
        let (p, n) = (a.pool_ptr(), a.pool_len());
        // SAFETY: the transport's own pool.
        #[allow(unsafe_code)]
        let ra = unsafe { a.register(p, n) }.expect("register");
        let (b, _) = open("shm", DeliveryMode::Complete, len);
        let (to, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
        let write = |cookie, len| write_op(ra, &to, base, cookie, len);
        reach(&mut a, 0, |a| a.post_write(&write(0, 8)));
        b.hold_progress(true);
        std::thread::sleep(Duration::from_millis(20));
        pool_mut(&mut a).fill(0x11);
        a.post_write(&write(1, len as u64)).unwrap();
        assert!(
            wait_completion(&mut a, 1, Duration::from_millis(300)).is_none(),
            "a peer that does not drive its queue stalls the write"
        );
        match how {
            End::Cancel => {
                let e = a.cancel_transfers(&to).unwrap_err();
                assert!(e.to_string().contains("cannot end"), "{e}");
            }
            End::Deregister => {
                let e = a.deregister(ra).unwrap_err();
                assert!(e.to_string().contains("cannot end"), "{e}");
                assert!(a.session_id().contains(':'), "the region is still named");
            }
            End::Timeout => {}
        }
        // Held: nothing is reported while the peer may still copy.
        assert!(
            wait_completion(&mut a, 1, Duration::from_millis(700)).is_none(),
            "{how:?}: reported while the peer may still copy its bytes"
        );
        b.hold_progress(false);
        let e = wait_completion(&mut a, 1, Duration::from_secs(10))
            .expect("reported once the peer ended it")
            .expect_err("given up");
        assert_eq!(e.kind(), FaultKind::Timeout, "{how:?}: {e}");
        if how == End::Deregister {
            a.deregister(ra)
                .expect("nothing of the region moves any more");
        }
    }
}

/// While one peer's write stalls and is ended (the endpoint reset under
/// it), a write to another peer in flight at the same time completes, its
/// bytes all there: its chunks cut short are posted again.
#[test]
fn ending_one_peers_write_leaves_another_peers_write_whole() {
    for provider in ["tcp;ofi_rxm"] {
        let len = 64usize << 20;
        let cfg = config(provider, DeliveryMode::Complete);
        let (mut a, ra) = open_with(&cfg, len);
        let (b, _) = open(provider, DeliveryMode::Complete, 16 << 20);
        let (c, _) = open(provider, DeliveryMode::Complete, len);
        let stalled: &'static str = b.session_id().to_owned().leak();
        let other: &'static str = c.session_id().to_owned().leak();
        let (sbase, obase) = (b.pool_ptr() as u64, c.pool_ptr() as u64);
        let op = |to: &'static str, base, cookie, len| write_op(ra, to, base, cookie, len);
        reach(&mut a, 0, |a| a.post_write(&op(stalled, sbase, 0, 8)));
        reach(&mut a, 1, |a| a.post_write(&op(other, obase, 1, 8)));
        fill(pool_mut(&mut a), 7);
        b.hold_progress(true);
        std::thread::sleep(Duration::from_millis(20));
        a.post_write(&op(stalled, sbase, 2, 16 << 20)).unwrap();
        a.post_write(&op(other, obase, 3, len as u64)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        a.cancel_transfers(stalled)
            .expect("the stalled write is ended");
        let mut outcomes = HashMap::new();
        let end = Instant::now() + Duration::from_secs(20);
        while outcomes.len() < 2 && Instant::now() < end {
            if let Some(c) = a.poll_completion() {
                outcomes.insert(c.cookie, c.result);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        assert!(outcomes[&2].is_err(), "{provider}: the stalled write ended");
        assert!(
            outcomes[&3].is_ok(),
            "{provider}: the other write completed: {:?}",
            outcomes[&3]
        );
        assert!(pool(&c) == pool(&a), "{provider}: the other write is whole");
        b.hold_progress(false);
    }
}

/// A read from a peer that stopped driving its queue, ended as `how`
/// says: its completion comes once it has ended, and its destination
/// never changes afterwards, even once the peer drives its queue again.
fn a_stalled_read_ends_before_it_is_reported(provider: &str, how: End) {
    let len = 16usize << 20;
    let (mut a, mut ra) = stalling_sender(provider, how, len);
    let (mut b, _) = open(provider, DeliveryMode::Complete, len);
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
    match end_stalled(&mut a, &mut ra, &from, 1, how) {
        Some(e) => {
            assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
            assert!(e.to_string().contains("read from"), "{e}");
        }
        None => unreachable!("every way of ending reports the read"),
    }
    // From here the destination is the caller's again: whatever the peer
    // does once it drives its queue, none of its bytes may arrive.
    let after = pool(&a).to_vec();
    b.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pool(&a) == &after[..],
        "the destination changed after the read was reported"
    );
    // The peer is reached anew, by the same session id.
    reach(&mut a, 2, |a| {
        a.post_read(&read_op(ra, 0, 4096, &from, base, 2))
    });
    assert!(pool(&a)[..4096].iter().all(|&x| x == 0x33));
}

/// Over tcp: cancelled, timed out or with its destination deregistered.
#[test]
fn a_read_from_a_stalled_peer_writes_its_destination_no_more_however_it_ends() {
    each_end("tcp;ofi_rxm", a_stalled_read_ends_before_it_is_reported);
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
