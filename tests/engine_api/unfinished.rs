//! Transfers that end unfinished: past their deadline or released while
//! their writes stall (the destination never changes afterwards), and on a
//! data plane that cannot end them (the call returns by its deadline and
//! grace, and the memory stays in use until they end).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tensorferry::core::transport::FaultKind;
#[cfg(feature = "verbs-sim")]
use tensorferry::engine::Transfer;
#[cfg(any(feature = "fabric", feature = "verbs-sim"))]
use tensorferry::engine::TransferState;
use tensorferry::engine::{EngineError, Op, TransferEngine};

#[cfg(any(feature = "fabric", feature = "verbs-sim"))]
use super::expect_pattern;
#[cfg(feature = "fabric")]
use super::{fabric, pattern, HeldReceiver};
#[cfg(feature = "verbs-sim")]
use super::{sim, Pair, MEM};
use super::{Buf, WAIT};

/// A transfer whose writes stall past its deadline fails with a timeout
/// once they have ended; a transfer released while its writes stall
/// returns once they have ended. Either way, the destination never
/// changes afterwards, though the source does and the peer goes on.
#[cfg(feature = "verbs-sim")]
#[test]
fn a_transfer_ended_while_its_writes_stall_never_changes_the_destination() {
    let ((a, stall), (b, _)) = (sim::engine(), sim::engine());
    let p = Pair::of(a, b);
    let peer = p.b.session_id();
    let len = 256 << 10;
    // Connected first, so that only the data is in question.
    p.a.write(&peer, &[p.op(MEM - 8, MEM - 8, 8)], WAIT)
        .unwrap();
    p.mem_a.fill(0, len, 1);
    // Releases `x` (ended unfinished, so the release fails), refills the
    // source with `seed` and lets the peer go on: a new transfer lands,
    // `x` never does.
    let never_lands = |x: Transfer, seed: u32, what: &str| {
        x.release().unwrap_err();
        p.mem_a.fill(0, len, seed);
        stall.store(false, Ordering::Relaxed);
        p.a.write(&peer, &[p.op(MEM - 8, MEM - 8, 8)], WAIT)
            .unwrap();
        assert!(
            p.mem_b.bytes()[..len].iter().all(|&x| x == 0),
            "{what}'s bytes landed"
        );
    };

    // Past its deadline.
    stall.store(true, Ordering::Relaxed);
    let x =
        p.a.post_write(&peer, &[p.op(0, 0, len)], Duration::from_millis(200), None)
            .unwrap();
    let e = x.wait(WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert!(matches!(e, EngineError::Timeout { .. }), "{e}");
    never_lands(x, 2, "a timed-out transfer");

    // Released unfinished.
    stall.store(true, Ordering::Relaxed);
    let x =
        p.a.post_write(&peer, &[p.op(0, 0, len)], WAIT, None)
            .unwrap();
    assert_eq!(
        x.wait(Duration::from_millis(50)).unwrap(),
        TransferState::Pending
    );
    never_lands(x, 3, "a released transfer");

    // And a transfer with the peer after that lands whole.
    p.a.write(&peer, &[p.op(0, 0, len)], WAIT).unwrap();
    assert!(expect_pattern(&p.mem_b.bytes()[..len], 3));
}

/// The same over libfabric's tcp provider, with a handle: the peer is a
/// libfabric transport that stops driving its queue (as a stalled process
/// would), where the writes then stall in the sockets; the transfer times
/// out, and once it says so the source is the caller's again and the
/// destination never sees a byte of it.
#[cfg(feature = "fabric")]
#[test]
fn a_fabric_transfer_timed_out_while_its_writes_stall_never_changes_the_destination() {
    use tensorferry::core::transport::Transport;

    let engine = fabric("tcp;ofi_rxm");
    let len = 16usize << 20;
    let receiver = HeldReceiver::new(len);
    let src = Buf::new(len);
    src.fill(0, len, 1);
    // SAFETY: `src` outlives the engine (dropped after it, below).
    unsafe { engine.register(src.addr(), len as u64) }.unwrap();
    let to = receiver.transport.session_id().to_owned();
    let op = |len: usize| Op {
        src: src.addr(),
        dst: receiver.base(),
        len: len as u64,
    };
    // Connected first (retried: a first connect on a loaded machine may
    // take longer than the plane's write timeout).
    let mut tries = 0;
    while let Err(e) = engine.write(&to, &[op(8)], WAIT) {
        tries += 1;
        assert!(tries < 5, "{e}");
    }
    receiver.transport.hold_progress(true);
    let x = engine
        .post_write(&to, &[op(len)], Duration::from_millis(300), None)
        .unwrap();
    let e = x.wait(WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert_eq!(x.state(), TransferState::Failed);
    drop(x);
    src.fill(0, len, 2);
    receiver.transport.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    // What landed is the first source's or nothing, never the second's.
    let now = receiver.placed();
    assert!(
        now[..len]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == 0 || b == pattern(1, i)),
        "a byte of the source was read after the transfer said it timed out"
    );
    // The peer is reached anew.
    let mut tries = 0;
    while let Err(e) = engine.write(&to, &[op(4096)], WAIT) {
        tries += 1;
        assert!(tries < 5, "{e}");
    }
    assert!(expect_pattern(&receiver.placed()[..4096], 2));
    drop(engine);
}

/// An embedder's data plane that takes writes and never finishes them,
/// and cannot end them (its `cancel_transfers` says so), until told to:
/// what a peer that took an operation and stopped leaves.
mod unending {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tensorferry::core::transport::{
        Capabilities, Completion, FaultKind, ReadOp, Region, Transport, WriteOp,
    };

    #[derive(Debug, thiserror::Error)]
    #[error("cannot end it")]
    pub struct CannotEnd;

    pub struct Unending {
        pub finish: Arc<AtomicBool>,
        held: VecDeque<u64>,
        next: u32,
    }

    impl Unending {
        pub fn new() -> (Self, Arc<AtomicBool>) {
            let finish = Arc::new(AtomicBool::new(false));
            let t = Self {
                finish: Arc::clone(&finish),
                held: VecDeque::new(),
                next: 1,
            };
            (t, finish)
        }
    }

    impl Transport for Unending {
        type Error = CannotEnd;
        fn fault_kind(_: &CannotEnd) -> FaultKind {
            FaultKind::Timeout
        }
        fn session_id(&self) -> &str {
            "unending"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                max_write: u64::MAX,
                delivery_complete: true,
                write_lifetime: Duration::ZERO,
            }
        }
        unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, CannotEnd> {
            self.next += 1;
            Ok(Region {
                id: self.next,
                addr: addr as u64,
                len: len as u64,
            })
        }
        fn deregister(&mut self, _region: Region) -> Result<(), CannotEnd> {
            Ok(())
        }
        fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), CannotEnd> {
            self.held.push_back(write.cookie);
            Ok(())
        }
        fn post_read(&mut self, _read: &ReadOp<'_>) -> Result<(), CannotEnd> {
            Err(CannotEnd)
        }
        fn poll_completion(&mut self) -> Option<Completion<CannotEnd>> {
            if !self.finish.load(Ordering::Relaxed) {
                return None;
            }
            self.held.pop_front().map(|cookie| Completion {
                cookie,
                result: Ok(()),
            })
        }
        fn cancel_transfers(&mut self, _session: &str) -> Result<(), CannotEnd> {
            Err(CannotEnd)
        }
    }
}

/// A data plane that cannot end a transfer's operations: `write` returns
/// no later than its deadline and the stated grace
/// (`tensorferry::engine::END_GRACE`), saying that bytes may still move,
/// rather than waiting for ever; the transfer is freed once they end.
#[test]
fn a_transfer_the_data_plane_cannot_end_returns_by_its_deadline_and_grace() {
    let (t, finish) = unending::Unending::new();
    let engine = TransferEngine::over(t, "unending", Default::default()).unwrap();
    let src = Buf::new(4096);
    // SAFETY: `src` outlives the engine (dropped after it, below).
    unsafe { engine.register(src.addr(), 4096) }.unwrap();
    let op = Op {
        src: src.addr(),
        dst: 0x1000,
        len: 4096,
    };
    let deadline = Duration::from_millis(200);
    let start = Instant::now();
    let e = engine.write("unending", &[op], deadline).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, EngineError::NotEnded { .. }), "{e}");
    assert_eq!(e.kind(), FaultKind::Timeout);
    assert!(e.to_string().contains("may still move"), "{e}");
    assert!(
        took >= deadline + tensorferry::engine::END_GRACE - Duration::from_millis(50)
            && took < deadline + tensorferry::engine::END_GRACE + Duration::from_secs(3),
        "returned after {took:?}"
    );
    // Its memory stays in use: the engine refuses to let it go (whatever
    // the data plane would say), naming the operation not ended.
    let e = engine.deregister(src.addr()).unwrap_err();
    assert!(matches!(e, EngineError::NotEnded { pending: 1, .. }), "{e}");
    // Its operation ends at last: the engine goes on, and a new transfer
    // completes.
    finish.store(true, Ordering::Relaxed);
    engine.write("unending", &[op], WAIT).unwrap();
    // Now nothing of it moves: the memory is let go.
    engine.deregister(src.addr()).unwrap();
    drop(engine);
    drop(src);
}
