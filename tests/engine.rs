//! `ferry::engine::TransferEngine` in one process: two engines, the same
//! calls as between processes (the Python tests run them between
//! processes, and sglang's own transfer code on top).

use std::time::Duration;

use ferry::core::transport::FaultKind;
use ferry::engine::{Backend, EngineError, LocalConfig, Op, TransferEngine};

const WAIT: Duration = Duration::from_secs(10);

fn pair(backend: impl Fn() -> Backend) -> (TransferEngine, TransferEngine) {
    (
        TransferEngine::open(backend()).unwrap(),
        TransferEngine::open(backend()).unwrap(),
    )
}

fn check(backend: impl Fn() -> Backend) {
    let (a, b) = pair(backend);
    let src: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; 4 << 20];
    let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
    // SAFETY: both vectors outlive the engines' use of them (the engines
    // are dropped, and with them every registration, at the end).
    unsafe {
        a.register(s, src.len() as u64).unwrap();
        b.register(d, dst.len() as u64).unwrap();
    }
    let peer = b.session_id();
    a.write(
        &peer,
        &[Op {
            src: s,
            dst: d + 4096,
            len: src.len() as u64,
        }],
        WAIT,
    )
    .unwrap();
    a.write_lists(&peer, &[s + 10, s + 20], &[d, d + 100], &[5, 7], WAIT)
        .unwrap();
    assert_eq!(&dst[4096..4096 + src.len()], &src[..]);
    assert_eq!(&dst[0..5], &src[10..15]);
    assert_eq!(&dst[100..107], &src[20..27]);

    let e = a.write_lists(&peer, &[s], &[d, d], &[1], WAIT).unwrap_err();
    assert!(matches!(e, EngineError::BatchShape { .. }), "{e}");
    let outside = [Op {
        src: s + src.len() as u64 - 1,
        dst: d,
        len: 2,
    }];
    let e = a.write(&peer, &outside, WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    let past = [Op {
        src: s,
        dst: d + dst.len() as u64 - 1,
        len: 2,
    }];
    let e = a.write(&peer, &past, WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    assert!(matches!(
        b.deregister(d + 1),
        Err(EngineError::NotRegistered { .. })
    ));
    b.deregister(d).unwrap();
    drop((a, b));
}

#[test]
fn local_engines_write_into_each_others_memory() {
    check(|| Backend::Local(LocalConfig::default()));
    let (a, _) = pair(|| Backend::Local(LocalConfig::default()));
    assert_eq!(a.backend(), "local");
    assert!(a.session_id().starts_with("local:"));
}

#[cfg(feature = "fabric")]
#[test]
fn fabric_engines_write_into_each_others_memory() {
    // tcp;ofi_rxm on loopback needs its interface named.
    std::env::set_var("FI_TCP_IFACE", "lo");
    for provider in ["tcp;ofi_rxm", "shm"] {
        check(|| {
            let mut c = ferry_fabric::FabricConfig::new(provider.parse().unwrap());
            c.write_timeout = Duration::from_secs(2);
            Backend::Fabric(c)
        });
    }
}
