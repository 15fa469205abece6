//! Two engines in one process: the writes go through the same system calls
//! as between processes (the peer is found by its pid and descriptor).

use super::*;

fn engine() -> LocalEngine {
    LocalEngine::open(LocalConfig::default()).unwrap()
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

#[test]
fn writes_and_batches_land_byte_for_byte() {
    let (a, b) = (engine(), engine());
    let src: Vec<u8> = (0..(24u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; 24 << 20];
    a.register(addr(&src), src.len() as u64).unwrap();
    b.register(addr(&dst), dst.len() as u64).unwrap();
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
    a.register(addr(&src), 4096).unwrap();
    b.register(addr(&dst), 4096).unwrap();
    let op = |s, d, len| Op {
        src: s,
        dst: d,
        len,
    };
    let e = a
        .write(b.session_id(), &[op(addr(&src), addr(&dst) + 1, 4096)])
        .unwrap_err();
    assert!(matches!(e, LocalError::DestOutOfBounds { .. }), "{e}");
    assert!(e.to_string().contains("outside every region peer"), "{e}");
    let e = a
        .write(b.session_id(), &[op(addr(&src) + 8, addr(&dst), 4096)])
        .unwrap_err();
    assert!(matches!(e, LocalError::SourceOutOfBounds { .. }), "{e}");
    // Deregistered: refused.
    b.deregister(addr(&dst)).unwrap();
    let e = a
        .write(b.session_id(), &[op(addr(&src), addr(&dst), 16)])
        .unwrap_err();
    assert!(matches!(e, LocalError::DestOutOfBounds { .. }), "{e}");
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
    a.register(addr(&src), 64).unwrap();
    let b = engine();
    let dst = vec![0u8; 64];
    b.register(addr(&dst), 64).unwrap();
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
    a.register(0x10000, 0x1000).unwrap();
    for (at, len, why) in [
        (0x10800, 0x1000, "overlaps"),
        (0x0f000, 0x1001, "overlaps"),
        (0x20000, 0, "empty"),
        (u64::MAX - 4, 8, "overflows"),
    ] {
        let e = a.register(at, len).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    a.register(0x11000, 0x1000).unwrap();
    a.register(0x8000, 0x1000).unwrap();
    assert_eq!(
        a.regions(),
        vec![(0x8000, 0x1000), (0x10000, 0x1000), (0x11000, 0x1000)]
    );
}
