//! `tensorferry::engine::TransferEngine` in one process: two engines, the same
//! calls as between processes (the Python tests run them between
//! processes, and sglang's own transfer code on top).

use std::time::Duration;

use tensorferry::core::transport::FaultKind;
use tensorferry::engine::{DataPlane, EngineError, LocalConfig, Op, TransferEngine};

const WAIT: Duration = Duration::from_secs(10);

#[cfg(feature = "fabric")]
#[path = "common/held_receiver.rs"]
mod held_receiver;
#[cfg(feature = "fabric")]
use held_receiver::HeldReceiver;

fn pair(backend: impl Fn() -> DataPlane) -> (TransferEngine, TransferEngine) {
    (
        TransferEngine::open(backend()).unwrap(),
        TransferEngine::open(backend()).unwrap(),
    )
}

fn check(backend: impl Fn() -> DataPlane) {
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
    check(|| DataPlane::Local(LocalConfig::default()));
    let (a, _) = pair(|| DataPlane::Local(LocalConfig::default()));
    assert_eq!(a.backend(), "local");
    assert!(a.session_id().starts_with("local:"));
}

#[cfg(feature = "fabric")]
#[test]
fn fabric_engines_write_into_each_others_memory() {
    // tcp;ofi_rxm on loopback needs its interface named.
    std::env::set_var("FI_TCP_IFACE", "lo");
    check(|| {
        let mut c = tensorferry_fabric::FabricConfig::new("tcp;ofi_rxm".parse().unwrap());
        c.write_timeout = Duration::from_secs(2);
        DataPlane::Fabric(c)
    });
}

/// libfabric 1.17's shm cannot end an operation a peer has taken: the
/// engine, whose calls return only once nothing of theirs moves, refuses
/// it and names what would serve.
#[cfg(feature = "fabric")]
#[test]
fn the_engine_refuses_a_provider_that_cannot_end_a_peers_operations() {
    let c = tensorferry_fabric::FabricConfig::new("shm".parse().unwrap());
    let e = TransferEngine::open(DataPlane::Fabric(c)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("libfabric shm") && text.contains("local data plane"),
        "{text}"
    );
}

/// A write that times out: the engine returns only once the data plane
/// has ended it, so that a source changed after the return never reaches
/// the peer. The peer is a libfabric transport that stops driving its
/// queue (as a stalled process would), over tcp, where the write then
/// stalls in the sockets.
#[cfg(feature = "fabric")]
#[test]
fn a_timed_out_fabric_write_reads_its_source_no_more_after_it_returns() {
    use tensorferry::core::transport::Transport;
    use tensorferry_fabric::{FabricConfig, Provider};

    std::env::set_var("FI_TCP_IFACE", "lo");
    assert!(
        std::env::var_os("FI_AV_REMOVE_CLEANUP").is_none(),
        "the engine needs no libfabric setting to end a write"
    );
    let len = 16usize << 20;
    let receiver = HeldReceiver::new(len);
    let engine = TransferEngine::open(DataPlane::Fabric(FabricConfig::new(Provider::Named(
        "tcp;ofi_rxm".into(),
    ))))
    .unwrap();
    let mut src = vec![0x11u8; len];
    // SAFETY: `src` outlives the engine's registration (the engine is
    // dropped first, below).
    unsafe { engine.register(src.as_ptr() as u64, len as u64) }.unwrap();
    let to = receiver.transport.session_id().to_owned();
    let from = src.as_ptr() as u64;
    let op = |len: usize| Op {
        src: from,
        dst: receiver.base(),
        len: len as u64,
    };
    // Connected first, so that only the data is in question.
    engine.write(&to, &[op(8)], WAIT).unwrap();
    receiver.transport.hold_progress(true);
    let e = engine
        .write(&to, &[op(len)], Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    // The source is the caller's again.
    src.fill(0x22);
    receiver.transport.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !receiver.placed().contains(&0x22),
        "a byte of the source was read after the timed-out write returned"
    );
    // The peer is reached anew.
    engine.write(&to, &[op(4096)], WAIT).unwrap();
    assert!(receiver.placed()[..4096].iter().all(|&x| x == 0x22));
    drop(engine);
}

/// The local plane makes a write within one poll, on whichever thread
/// polls: a write whose caller times out while another caller's long copy
/// holds the transport either was made before its call returned or is
/// never made. A destination reset after each return stays as it was.
#[test]
fn a_timed_out_local_write_is_made_before_its_call_returns_or_never() {
    let (a, b) = pair(|| DataPlane::Local(LocalConfig::default()));
    let big = 256usize << 20;
    let big_src = vec![1u8; big];
    let mut big_dst = vec![0u8; big];
    let mut small_src = vec![0u8; 4096];
    let mut small_dst = vec![0u8; 4096];
    // SAFETY: every vector outlives the engines (dropped at the end).
    unsafe {
        a.register(big_src.as_ptr() as u64, big as u64).unwrap();
        a.register(small_src.as_ptr() as u64, 4096).unwrap();
        b.register(big_dst.as_mut_ptr() as u64, big as u64).unwrap();
        b.register(small_dst.as_mut_ptr() as u64, 4096).unwrap();
    }
    let peer = b.session_id();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (mut made, mut timed_out) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let op = Op {
                src: big_src.as_ptr() as u64,
                dst: big_dst.as_mut_ptr() as u64,
                len: big as u64,
            };
            // The long copies only keep the transport busy: on a loaded
            // machine one may time out too, which changes nothing here.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Err(e) = a.write(&peer, &[op], WAIT) {
                    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
                }
            }
        });
        let small = [Op {
            src: small_src.as_ptr() as u64,
            dst: small_dst.as_mut_ptr() as u64,
            len: 4096,
        }];
        for round in 1..=40u8 {
            small_src.fill(round);
            match a.write(&peer, &small, Duration::ZERO) {
                Ok(()) => {
                    made += 1;
                    assert!(small_dst.iter().all(|&x| x == round), "round {round}");
                }
                Err(e) => {
                    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
                    timed_out += 1;
                }
            }
            // Whatever came of it, nothing of it lands from here on.
            small_dst.fill(0);
            small_src.fill(0xee);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(
        small_dst.iter().all(|&x| x == 0),
        "a write landed after its call returned"
    );
    assert_eq!(made + timed_out, 40);
    eprintln!("made {made}, ended unmade {timed_out}");
}
