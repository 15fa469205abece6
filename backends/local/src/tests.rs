//! Two engines in one process: the writes go through the same system calls
//! as between processes (the peer is found by its pid and descriptor).

use super::*;
use tensorferry_core::transport::{FaultKind, OutsideOwnRegions, OutsidePeerRegions};

/// Which range `e` refuses: `"peer write"`, `"peer read"` (outside the
/// peer's regions), `"own write"` or `"own read"` (outside this engine's);
/// `None` for any other error.
pub(crate) fn refused_range(e: &LocalError) -> Option<&'static str> {
    match e {
        LocalError::OutsidePeer(OutsidePeerRegions { read: false, .. }) => Some("peer write"),
        LocalError::OutsidePeer(OutsidePeerRegions { read: true, .. }) => Some("peer read"),
        LocalError::OutsideOwn(OutsideOwnRegions { read: false, .. }) => Some("own write"),
        LocalError::OutsideOwn(OutsideOwnRegions { read: true, .. }) => Some("own read"),
        _ => None,
    }
}

fn engine() -> LocalEngine {
    LocalEngine::open(LocalConfig::default()).unwrap()
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

/// Registers with `e` memory the test keeps alive while registered, or
/// made-up ranges no peer is given to copy into.
#[allow(unsafe_code)]
pub(crate) fn reg(e: &LocalEngine, addr: u64, len: u64) -> Result<(), LocalError> {
    // SAFETY: each test keeps what it registers alive until its engines
    // are dropped, and reads it only when no copy into it runs.
    unsafe { e.register(addr, len) }
}

#[test]
fn writes_and_batches_land_byte_for_byte() {
    let (a, b) = (engine(), engine());
    let src: Vec<u8> = (0..(24u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; 24 << 20];
    reg(&a, addr(&src), src.len() as u64).unwrap();
    reg(&b, addr(&dst), dst.len() as u64).unwrap();
    // Large: spread over the threads.
    let op = Op {
        src: addr(&src),
        dst: addr(&dst),
        len: src.len() as u64,
    };
    a.write(b.session_id(), &[op]).unwrap();
    assert!(dst == src);
    // A batch of small ones, in one call.
    dst.fill(0);
    let ops: Vec<Op> = (0..3000u64)
        .map(|i| Op {
            src: addr(&src) + i * 100,
            dst: addr(&dst) + 5_000_000 + i * 97,
            len: 97,
        })
        .collect();
    a.write(b.session_id(), &ops).unwrap();
    for i in 0..3000usize {
        assert_eq!(
            dst[5_000_000 + i * 97..5_000_000 + i * 97 + 97],
            src[i * 100..i * 100 + 97]
        );
    }
}

#[test]
fn writes_outside_registered_memory_are_refused_by_name() {
    let (a, b) = (engine(), engine());
    let src = vec![1u8; 4096];
    let dst = vec![0u8; 4096];
    reg(&a, addr(&src), 4096).unwrap();
    reg(&b, addr(&dst), 4096).unwrap();
    let op = |s, d, len| Op {
        src: s,
        dst: d,
        len,
    };
    let e = a
        .write(b.session_id(), &[op(addr(&src), addr(&dst) + 1, 4096)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("peer write"), "{e}");
    assert!(e.to_string().contains("lies in none of peer"), "{e}");
    let e = a
        .write(b.session_id(), &[op(addr(&src) + 8, addr(&dst), 4096)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("own write"), "{e}");
    // Deregistered: refused.
    b.deregister(addr(&dst)).unwrap();
    let e = a
        .write(b.session_id(), &[op(addr(&src), addr(&dst), 16)])
        .unwrap_err();
    assert_eq!(refused_range(&e), Some("peer write"), "{e}");
    assert!(dst.iter().all(|b| *b == 0));
    assert!(matches!(
        b.deregister(addr(&dst)),
        Err(LocalError::NotRegistered { .. })
    ));
}

#[test]
fn a_closed_engine_and_strangers_are_named() {
    let a = engine();
    let src = vec![1u8; 64];
    reg(&a, addr(&src), 64).unwrap();
    let b = engine();
    let dst = vec![0u8; 64];
    reg(&b, addr(&dst), 64).unwrap();
    let gone = b.session_id().to_owned();
    let op = Op {
        src: addr(&src),
        dst: addr(&dst),
        len: 64,
    };
    a.write(&gone, &[op]).unwrap();
    drop(b);
    let e = a.write(&gone, &[op]).unwrap_err();
    assert!(matches!(e, LocalError::PeerGone { .. }), "{e}");
    // Its descriptor is closed (or is another file now): attaching anew
    // finds no table of that engine.
    let e = a.write(&gone, &[op]).unwrap_err();
    assert!(matches!(e, LocalError::PeerGone { .. }), "{e}");
    let s = Session::parse(&gone).unwrap();
    let elsewhere = Session {
        host: "00ff.1".into(),
        ..s.clone()
    };
    let e = a.write(&elsewhere.to_string(), &[op]).unwrap_err();
    assert!(matches!(e, LocalError::OtherHost { .. }), "{e}");
    let e = a.write("mooncake:1.2.3.4:5", &[op]).unwrap_err();
    assert!(matches!(e, LocalError::BadSession { .. }), "{e}");
}

#[test]
fn registrations_are_checked() {
    let a = engine();
    reg(&a, 0x10000, 0x1000).unwrap();
    for (at, len, why) in [
        (0x10800, 0x1000, "overlaps"),
        (0x0f000, 0x1001, "overlaps"),
        (0x20000, 0, "empty"),
        (u64::MAX - 4, 8, "overflows"),
    ] {
        let e = reg(&a, at, len).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    reg(&a, 0x11000, 0x1000).unwrap();
    reg(&a, 0x8000, 0x1000).unwrap();
    assert_eq!(
        a.regions(),
        vec![(0x8000, 0x1000), (0x10000, 0x1000), (0x11000, 0x1000)]
    );
}

#[test]
fn a_deregistration_a_live_peer_is_still_copying_into_fails_and_keeps_the_region() {
    let a = engine();
    let b = LocalEngine::open(LocalConfig {
        drain_wait: Duration::from_millis(50),
        ..LocalConfig::default()
    })
    .unwrap();
    let dst = vec![0u8; 4096];
    reg(&b, addr(&dst), 4096).unwrap();
    // `a` counted inside `b`'s table, as a copy of its is while it runs
    // (a peer stopped mid-copy stays so).
    let peer = a.peer(b.session_id()).unwrap();
    let inside = peer.table.enter(peer.lease.as_ref());
    let e = b.deregister(addr(&dst)).unwrap_err();
    assert!(
        matches!(&e, LocalError::PeerInside { pids, .. } if pids == &[std::process::id()]),
        "{e}"
    );
    assert_eq!(e.kind(), FaultKind::Timeout);
    // Out of the table: no new copy reaches it, and it cannot be
    // registered again while the old copy may still touch it.
    assert!(b.regions().is_empty());
    let w = Op {
        src: 0,
        dst: addr(&dst),
        len: 8,
    };
    let src = [7u8; 8];
    reg(&a, addr(&src), 8).unwrap();
    let refused = a
        .write(
            b.session_id(),
            &[Op {
                src: addr(&src),
                ..w
            }],
        )
        .unwrap_err();
    assert_eq!(refused_range(&refused), Some("peer write"), "{refused}");
    let again = reg(&b, addr(&dst), 4096).unwrap_err().to_string();
    assert!(again.contains("has not ended"), "{again}");
    // Once the copy is out, the deregistration ends.
    drop(inside);
    b.deregister(addr(&dst)).unwrap();
    assert!(matches!(
        b.deregister(addr(&dst)),
        Err(LocalError::NotRegistered { .. })
    ));
    reg(&b, addr(&dst), 4096).unwrap();
}
