//! Writes: they arrive byte-exact through chunks and a small window, over
//! queue pairs walked through INIT, RTR and RTS; bad ones are refused,
//! typed; several regions are written, a later one reached through the
//! session id.

use tensorferry_core::transport::{
    FaultKind, OutsidePeerRegions, Region, RegionError, Transport, WriteOp, WriteTag,
};
use tensorferry_hostmem::HostPool;

use super::{fill, pair, Node};
use crate::attrs::QpStep;
use crate::conn::ConnState;
use crate::error::VerbsError;

#[test]
fn random_writes_arrive_byte_exact_through_chunks_and_a_small_window() {
    let (mut a, b) = pair();
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
    let (mut a, b) = pair();
    a.write_done(0, 100, &b, 0, 1);
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
fn bad_writes_are_refused_with_typed_errors() {
    let (mut a, b) = pair();
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
        Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: false, peer, ..
        })) => assert_eq!(peer, b.t.session_id()),
        other => panic!("{other:?}"),
    }
    // Now it is known, and refused at once.
    assert!(matches!(
        a.write(0, 10, &b, b.pool.len() as u64 - 5, 3),
        Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: false,
            ..
        }))
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
        Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: false,
            ..
        }))
    ));
    // The connection is still good.
    a.write_done(0, 10, &b, 0, 5);
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
    let (mut a, mut b) = pair();
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
        Err(VerbsError::OutsidePeer(OutsidePeerRegions {
            read: false,
            regions: 1,
            ..
        }))
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
            Err(VerbsError::OutsidePeer(OutsidePeerRegions {
                read: false,
                regions: 1,
                ..
            }))
        ),
        "{c:?}"
    );
    write(&mut a, rs, &third, b.region.addr, 6).unwrap();
    assert!(a.wait(1)[0].result.is_ok());
    drop((a, b));
}
