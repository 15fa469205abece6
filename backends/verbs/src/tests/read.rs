//! RDMA READ: a read brings the bytes the peer's registered memory holds
//! into this process's region, on the connection writes use, so that
//! chunks, the window, cookies, the write timeout, `cancel_transfers` and
//! a broken connection cover reads as they cover writes. Cancelled or
//! timed out, a stalled read is flushed unrun: once its completion is
//! handed out its destination never changes, whatever the peer's memory
//! then holds.

use tensorferry_core::transport::{
    FaultKind, OutsidePeerRegions, ReadOp, Region, RegionError, Transport,
};

use super::{connect, drain, fill, node, pair, release, stall, waiting, Node, LEN};
use crate::attrs::{QpStep, RD_ATOMIC};
use crate::conn::ConnState;
use crate::device::RdmaOp;
use crate::error::VerbsError;
use crate::status::WcStatus;

/// The `max_rd_atomic` of each RTS, and the `max_dest_rd_atomic` of each
/// RTR, `n`'s queue pairs were moved to.
fn read_limits(n: &Node) -> (Vec<u8>, Vec<u8>) {
    let log = n.t.with_device_mut(|d| d.log.clone());
    let rts = log
        .iter()
        .filter_map(|(_, s)| match s {
            QpStep::Rts { max_rd_atomic, .. } => Some(*max_rd_atomic),
            _ => None,
        })
        .collect();
    let rtr = log
        .iter()
        .filter_map(|(_, s)| match s {
            QpStep::Rtr {
                max_dest_rd_atomic, ..
            } => Some(*max_dest_rd_atomic),
            _ => None,
        })
        .collect();
    (rts, rtr)
}

fn read_from(a: &mut Node, session: &str, src_addr: u64, len: u64, cookie: u64) {
    a.t.post_read(&ReadOp {
        region: a.region,
        local_offset: 0,
        len,
        src_session: session,
        src_addr,
        cookie,
    })
    .unwrap();
}

#[test]
fn reads_return_the_peers_bytes_through_chunks_and_a_small_window() {
    let (mut a, mut b) = pair();
    fill(b.bytes_mut(), 11);
    // (local offset, length, the peer's offset): around the 4 KiB
    // message, and past the window of 8 work requests.
    let reads = [
        (0u64, 1u64, 0u64),
        (10, 4096, 100),
        (5000, 4097, 20_000),
        (30_000, LEN, 200_000),
        (300_000, 200_000, 700_000),
    ];
    for (i, &(dst, len, src)) in reads.iter().enumerate() {
        a.read(dst, len, &b, src, i as u64).unwrap();
    }
    let mut done = a.wait(reads.len());
    done.sort_by_key(|c| c.cookie);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(c.cookie, i as u64);
        assert!(c.result.is_ok(), "{:?}", c.result);
    }
    for &(dst, len, src) in &reads {
        let (dst, len, src) = (dst as usize, len as usize, src as usize);
        assert_eq!(a.bytes()[dst..dst + len], b.bytes()[src..src + len]);
    }
    // A read of no bytes completes, as a write of none does.
    a.read(0, 0, &b, 0, 99).unwrap();
    let c = a.wait(1).remove(0);
    assert_eq!(c.cookie, 99);
    assert!(c.result.is_ok(), "{:?}", c.result);
    assert_eq!(a.t.with_device_mut(|d| d.qps_created), 1);
    assert_eq!(a.t.connection(b.t.session_id()), Some(ConnState::Ready));
    // The reader's queue pair keeps reads outstanding, the target's
    // answers them (the stand-in refuses a READ on queue pairs without).
    assert_eq!(read_limits(&a).0, [RD_ATOMIC]);
    assert_eq!(read_limits(&b).1, [RD_ATOMIC]);
}

/// Posted before the connection exists, so that they go out in one run
/// of pumps in the order posted: each completes with its own cookie, and
/// each read sees the peer's memory as the transfers before it left it
/// (a write after a read is fenced, and waits for it).
#[test]
fn reads_and_writes_in_one_batch_complete_each_with_its_own_cookie_in_posted_order() {
    const K: usize = LEN as usize;
    let (a1, a2, a3) = (512 << 10, 640 << 10, 768 << 10);
    let (b1, b2, b3) = (256 << 10, 384 << 10, 448 << 10);
    let (mut a, mut b) = pair();
    fill(&mut a.bytes_mut()[..3 * K], 21);
    fill(&mut b.bytes_mut()[..K], 22);
    let b_before = b.bytes()[..K].to_vec();
    // A write, then a read of what it wrote.
    a.write(0, LEN, &b, b1 as u64, 1).unwrap();
    a.read(a1 as u64, LEN, &b, b1 as u64, 2).unwrap();
    // A read, then a write over what it read.
    a.read(a2 as u64, LEN, &b, 0, 3).unwrap();
    a.write(LEN, LEN, &b, 0, 4).unwrap();
    a.write(2 * LEN, 5000, &b, b2 as u64, 5).unwrap();
    a.read(a3 as u64, 5000, &b, b2 as u64, 6).unwrap();
    a.write(2 * LEN + 8192, 100, &b, b3 as u64, 7).unwrap();
    let mut done = a.wait(7);
    done.sort_by_key(|c| c.cookie);
    let cookies: Vec<u64> = done.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, [1, 2, 3, 4, 5, 6, 7], "each once");
    for c in &done {
        assert!(c.result.is_ok(), "{c:?}");
    }
    assert_eq!(a.bytes()[a1..a1 + K], a.bytes()[..K], "read after write");
    assert_eq!(a.bytes()[a2..a2 + K], b_before[..], "read before write");
    assert_eq!(b.bytes()[..K], a.bytes()[K..2 * K]);
    assert_eq!(
        a.bytes()[a3..a3 + 5000],
        a.bytes()[2 * K..2 * K + 5000],
        "read after write"
    );
    assert_eq!(b.bytes()[b3..b3 + 100], a.bytes()[2 * K + 8192..][..100]);
    assert_eq!(
        a.t.with_device_mut(|d| d.fenced),
        2,
        "the first work request of each write that follows a read, and no other"
    );
}

#[test]
fn out_of_bounds_reads_are_refused_with_typed_errors() {
    let (mut a, mut b) = pair();
    fill(b.bytes_mut(), 41);
    let len = a.pool.len() as u64;
    // The local destination is checked as a write's source is.
    match a.read(len - 5, 10, &b, 0, 1) {
        Err(e @ VerbsError::Region(RegionError::SourceOutOfBounds { .. })) => {
            assert_eq!(e.kind(), FaultKind::OutOfBounds)
        }
        other => panic!("{other:?}"),
    }
    let read = |a: &mut Node, region: Region, session: &str, src_addr: u64, len: u64| {
        a.t.post_read(&ReadOp {
            region,
            local_offset: 0,
            len,
            src_session: session,
            src_addr,
            cookie: 9,
        })
    };
    let (mine, unknown) = (a.region, Region { id: 9, ..a.region });
    assert!(matches!(
        read(&mut a, unknown, b.t.session_id(), b.region.addr, 1),
        Err(VerbsError::Region(RegionError::Unknown(9)))
    ));
    assert!(matches!(
        read(&mut a, mine, "shm:/x@0+1", 0, 1),
        Err(VerbsError::BadSession { .. })
    ));
    // Before the connection exists the peer's bounds are unknown: the
    // read is refused once they are.
    let b_len = b.pool.len() as u64;
    a.read(0, 10, &b, b_len - 5, 2).unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::OutsidePeer(OutsidePeerRegions { read: true, .. })) => {
            assert_eq!(e.kind(), FaultKind::OutOfBounds);
            assert!(e.to_string().contains(b.t.session_id()), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Now they are known, and refused at once: past the end, before the
    // start, and an address whose end wraps.
    assert!(matches!(
        a.read(0, 10, &b, b_len - 5, 3),
        Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: true,
            regions: 1,
            ..
        }))
    ));
    let session = b.t.session_id().to_owned();
    for src in [b.region.addr - 1, u64::MAX - 3] {
        assert!(matches!(
            read(&mut a, mine, &session, src, 10),
            Err(VerbsError::OutsidePeer(OutsidePeerRegions {
                read: true,
                ..
            }))
        ));
    }
    assert!(a.t.poll_completion().is_none());
    assert!(a.bytes()[..10].iter().all(|&x| x == 0), "nothing was read");
    // The connection is still good.
    a.read_done(0, 10, &b, b_len - 10, 4);
    assert_eq!(a.bytes()[..10], b.bytes()[b_len as usize - 10..]);
}

#[test]
fn a_stalled_read_ended_by_cancel_transfers_completes_as_timeout_and_its_destination_never_changes()
{
    let mut a = node();
    let (mut b, d) = (node(), node());
    connect(&mut a, &b, 1);
    connect(&mut a, &d, 2);
    fill(&mut b.bytes_mut()[..LEN as usize], 31);
    fill(&mut a.bytes_mut()[LEN as usize..2 * LEN as usize], 32);
    stall(&a, true);
    a.read(0, LEN, &b, 0, 3).unwrap();
    // A write behind it on the same queue pair ends with it.
    a.write(LEN, 4096, &b, 2 * LEN, 4).unwrap();
    assert_eq!(waiting(&a), 8, "a window of work requests waits on the QP");
    assert!(a.t.poll_completion().is_none(), "the stalled read runs on");

    a.t.cancel_transfers(b.t.session_id()).unwrap();
    assert_eq!(waiting(&a), 0, "flushed before cancel_transfers returned");
    let done = drain(&mut a);
    let [read, write] = &done[..] else {
        panic!("{done:?}")
    };
    assert_eq!((read.cookie, write.cookie), (3, 4));
    match &read.result {
        Err(e @ VerbsError::Cancelled { op, peer }) => {
            assert_eq!(*op, RdmaOp::Read);
            assert_eq!(peer, b.t.session_id());
            assert_eq!(e.kind(), FaultKind::Timeout);
            assert!(e.to_string().starts_with("read from "), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(
            write.result,
            Err(VerbsError::Cancelled {
                op: RdmaOp::Write,
                ..
            })
        ),
        "{:?}",
        write.result
    );
    assert_eq!(a.t.connection(b.t.session_id()), None);
    assert_eq!(a.t.connection(d.t.session_id()), Some(ConnState::Ready));

    // The peer's memory changes and the stand-in goes on: nothing of the
    // ended read lands here, nor of the write there.
    fill(&mut b.bytes_mut()[..LEN as usize], 33);
    release(&mut a);
    assert!(
        a.bytes()[..LEN as usize].iter().all(|&x| x == 0),
        "an ended read landed"
    );
    assert!(b.bytes()[2 * LEN as usize..][..4096]
        .iter()
        .all(|&x| x == 0));

    // The next read connects anew and brings what the peer holds now.
    a.read(0, LEN, &b, 0, 5).unwrap();
    let c = a.wait(1).remove(0);
    assert!(c.result.is_ok(), "{:?}", c.result);
    assert_eq!(a.bytes()[..LEN as usize], b.bytes()[..LEN as usize]);
    assert_eq!(a.t.with_device_mut(|dev| dev.qps_created), 3);
}

#[test]
fn a_read_past_the_write_timeout_is_flushed_before_it_fails() {
    let (mut a, mut b) = pair();
    connect(&mut a, &b, 1);
    fill(&mut b.bytes_mut()[..LEN as usize], 51);
    stall(&a, true);
    a.read(0, LEN, &b, 0, 2).unwrap();
    a.read(LEN, 10, &b, 0, 3).unwrap();
    // The sweep fails the connection once the write timeout passed.
    let mut done = a.wait(2);
    done.sort_by_key(|c| c.cookie);
    assert_eq!(waiting(&a), 0, "flushed before the failure was reported");
    match &done[0].result {
        Err(e @ VerbsError::Timeout { op, peer, .. }) => {
            assert_eq!(*op, RdmaOp::Read);
            assert_eq!(peer, b.t.session_id());
            assert_eq!(e.kind(), FaultKind::Timeout);
        }
        other => panic!("{other:?}"),
    }
    match &done[1].result {
        Err(e @ VerbsError::Broken { op, .. }) => {
            assert_eq!(*op, RdmaOp::Read);
            assert!(e.to_string().starts_with("read from "), "{e}");
        }
        other => panic!("{other:?}"),
    }
    fill(&mut b.bytes_mut()[..LEN as usize], 52);
    release(&mut a);
    assert!(
        a.bytes()[..LEN as usize + 10].iter().all(|&x| x == 0),
        "an ended read landed"
    );
}

#[test]
fn a_read_from_a_peer_that_is_gone_fails_as_peer_gone() {
    let (mut a, mut b) = pair();
    fill(&mut b.bytes_mut()[..100], 61);
    a.read_done(0, 100, &b, 0, 1);
    assert_eq!(a.bytes()[..100], b.bytes()[..100]);
    let (session, addr) = (b.t.session_id().to_owned(), b.region.addr);
    drop(b);
    read_from(&mut a, &session, addr, 100, 2);
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::Completion { op, status, .. }) => {
            assert_eq!(op, RdmaOp::Read);
            assert_eq!(status, WcStatus::RETRY_EXCEEDED);
            assert_eq!(e.kind(), FaultKind::PeerGone);
            assert!(e.to_string().starts_with("read from "), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Nobody answers on the old endpoint now: the exchange times out.
    read_from(&mut a, &session, addr, 100, 3);
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::ConnectTimeout { .. }) => assert_eq!(e.kind(), FaultKind::PeerGone),
        other => panic!("{other:?}"),
    }
}

/// Each end says in the exchange how many reads its queue pair answers
/// at once; the other keeps no more outstanding, within its own device's
/// limit (the stand-in, as a NIC, refuses a queue pair set beyond its
/// device's). A peer that answers none cannot be read.
#[test]
fn read_depths_are_exchanged_and_a_peer_that_answers_no_reads_cannot_be_read() {
    let (mut a, mut b) = pair();
    fill(&mut b.bytes_mut()[..4096], 71);
    a.t.with_device_mut(|d| d.port_mut().max_qp_init_rd_atom = 4);
    b.t.with_device_mut(|d| d.port_mut().max_qp_rd_atom = 2);
    a.read_done(0, 4096, &b, 0, 1);
    assert_eq!(a.bytes()[..4096], b.bytes()[..4096]);
    assert_eq!(
        read_limits(&a),
        (vec![2], vec![RD_ATOMIC]),
        "a reads 2 at once"
    );
    assert_eq!(
        read_limits(&b),
        (vec![RD_ATOMIC], vec![2]),
        "b answers 2 at once (and a answers all b could read)"
    );

    let d = node();
    d.t.with_device_mut(|dev| dev.port_mut().max_qp_rd_atom = 0);
    a.read(0, 10, &d, 0, 2).unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::CannotRead { .. }) => {
            assert_eq!(e.kind(), FaultKind::Io);
            assert!(e.to_string().contains(d.t.session_id()), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // Writes to it go on, and a read is now refused at once.
    a.write_done(0, 10, &d, 0, 3);
    assert!(matches!(
        a.read(0, 10, &d, 0, 4),
        Err(VerbsError::CannotRead { .. })
    ));
    assert_eq!(a.t.connection(d.t.session_id()), Some(ConnState::Ready));
}
