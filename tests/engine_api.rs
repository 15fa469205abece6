//! The transfer engine's connector API on every data plane: transfers with
//! handles posted from many threads, one-sided reads, notifications
//! (attached and alone, in order, none lost), and what an ended transfer
//! guarantees. Two engines in this process, over the local plane, the
//! libfabric plane (`tcp;ofi_rxm` and `shm`) and the verbs stand-in.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensorferry::core::transport::FaultKind;
use tensorferry::engine::{
    Backend, EngineError, LocalConfig, Op, TransferEngine, TransferState, MAX_NOTIFICATION,
};

const WAIT: Duration = Duration::from_secs(20);

/// Memory an engine registers, kept by the test for as long as the engine.
struct Buf(Vec<u8>);

impl Buf {
    fn new(len: usize) -> Self {
        Self(vec![0; len])
    }

    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: read while no transfer into it is in flight, or to
        // compare bytes only (a torn read fails the comparison, as it
        // should).
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), self.0.len()) }
    }

    fn fill(&self, at: usize, len: usize, seed: u32) {
        let p = self.0.as_ptr() as *mut u8;
        for i in 0..len {
            // SAFETY: inside the vector; no transfer out of this range is
            // in flight while the test fills it.
            unsafe { *p.add(at + i) = pattern(seed, i) };
        }
    }
}

fn pattern(seed: u32, i: usize) -> u8 {
    ((i as u32)
        .wrapping_mul(31)
        .wrapping_add(seed.wrapping_mul(97))
        % 251) as u8
}

fn expect_pattern(bytes: &[u8], seed: u32) -> bool {
    bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(seed, i))
}

/// Two engines (`a` moves bytes, `b` is its peer) and their memory.
struct Pair {
    a: TransferEngine,
    b: TransferEngine,
    mem_a: Buf,
    mem_b: Buf,
}

const MEM: usize = 8 << 20;

impl Pair {
    fn of(a: TransferEngine, b: TransferEngine) -> Self {
        let (mem_a, mem_b) = (Buf::new(MEM), Buf::new(MEM));
        // SAFETY: the buffers live in the pair, dropped after the engines
        // (fields drop in order).
        unsafe {
            a.register(mem_a.addr(), MEM as u64).unwrap();
            b.register(mem_b.addr(), MEM as u64).unwrap();
        }
        Self { a, b, mem_a, mem_b }
    }

    fn op(&self, from: usize, to: usize, len: usize) -> Op {
        Op {
            src: self.mem_a.addr() + from as u64,
            dst: self.mem_b.addr() + to as u64,
            len: len as u64,
        }
    }

    fn read_op(&self, remote: usize, local: usize, len: usize) -> Op {
        Op {
            src: self.mem_b.addr() + remote as u64,
            dst: self.mem_a.addr() + local as u64,
            len: len as u64,
        }
    }

    /// Waits until `n` notifications reached `b`; checks each one's
    /// transfer's bytes as it arrives.
    fn notifications(&self, n: usize, check: impl Fn(&[u8])) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let until = Instant::now() + WAIT;
        while got.len() < n {
            assert!(Instant::now() < until, "{} of {n} notifications", got.len());
            for note in self.b.notifications().unwrap() {
                assert_eq!(note.from, self.a.session_id());
                check(&note.message);
                got.push(note.message);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        got
    }
}

// Dropped before the memory: fields drop in declaration order, and `a`
// and `b` come first.

/// Threads post transfers with notifications attached and wait for them;
/// every byte lands, and each notification arrives only once its
/// transfer's bytes are in the peer's memory.
fn transfers_from_many_threads(p: &Pair) {
    const THREADS: usize = 4;
    const EACH: usize = 16;
    const PART: usize = 16 << 10;
    const OPS: usize = 4;
    let span = PART * OPS;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let mut posted = Vec::new();
                for i in 0..EACH {
                    let at = (t * EACH + i) * span;
                    p.mem_a.fill(at, span, (t * EACH + i) as u32);
                    let ops: Vec<Op> = (0..OPS)
                        .map(|k| p.op(at + k * PART, at + k * PART, PART))
                        .collect();
                    let note = format!("{t}:{i}");
                    posted.push(
                        p.a.post_write(&p.b.session_id(), &ops, WAIT, Some(note.as_bytes()))
                            .unwrap(),
                    );
                }
                for x in posted {
                    x.finish().unwrap();
                }
            });
        }
    });
    let notes = p.notifications(THREADS * EACH, |m| {
        let text = std::str::from_utf8(m).unwrap();
        let (t, i) = text.split_once(':').unwrap();
        let n = t.parse::<usize>().unwrap() * EACH + i.parse::<usize>().unwrap();
        let at = n * span;
        assert!(
            expect_pattern(&p.mem_b.bytes()[at..at + span], n as u32),
            "notification {text} arrived before its bytes"
        );
    });
    let mut notes: Vec<String> = notes
        .into_iter()
        .map(|m| String::from_utf8(m).unwrap())
        .collect();
    notes.sort();
    notes.dedup();
    assert_eq!(notes.len(), THREADS * EACH, "a notification twice");
}

/// A transfer polled without waiting reaches `Done`; one waited on for no
/// time says where it stands.
fn polled_transfer(p: &Pair) {
    p.mem_a.fill(0, 1 << 20, 7);
    let x =
        p.a.post_write(&p.b.session_id(), &[p.op(0, 0, 1 << 20)], WAIT, None)
            .unwrap();
    let until = Instant::now() + WAIT;
    while x.state() == TransferState::Pending {
        assert!(Instant::now() < until, "never done");
        std::thread::yield_now();
    }
    assert_eq!(x.state(), TransferState::Done);
    assert_eq!(x.wait(Duration::ZERO).unwrap(), TransferState::Done);
    x.release().unwrap();
    assert!(expect_pattern(&p.mem_b.bytes()[..1 << 20], 7));
}

/// Reads bring the peer's bytes, synchronously and with a handle, and are
/// checked at both ends as writes are.
fn reads(p: &Pair) {
    let peer = p.b.session_id();
    let len = 3 << 20;
    p.mem_b.fill(MEM - len, len, 11);
    p.a.read(&peer, &[p.read_op(MEM - len, 0, len)], WAIT)
        .unwrap();
    assert!(expect_pattern(&p.mem_a.bytes()[..len], 11));
    // Small reads in one batch, with a handle.
    p.mem_b.fill(0, 4096, 12);
    let ops: Vec<Op> = (0..16)
        .map(|k| p.read_op(k * 256, (1 << 20) + k * 256, 256))
        .collect();
    let x = p.a.post_read(&peer, &ops, WAIT, None).unwrap();
    assert_eq!(x.wait(WAIT).unwrap(), TransferState::Done);
    x.release().unwrap();
    assert!(expect_pattern(
        &p.mem_a.bytes()[1 << 20..(1 << 20) + 4096],
        12
    ));
    // Outside the peer's registered memory.
    let e =
        p.a.read(&peer, &[p.read_op(MEM - 1, 0, 2)], WAIT)
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    // Into memory this engine did not register: refused before posting.
    let e =
        p.a.read(&peer, &[p.read_op(0, MEM - 1, 2)], WAIT)
            .unwrap_err();
    assert!(
        matches!(e, EngineError::DestinationOutOfBounds { .. }),
        "{e}"
    );
    // A read with a notification: the peer hears of it once done.
    let x =
        p.a.post_read(&peer, &[p.read_op(0, 0, 64)], WAIT, Some(b"read"))
            .unwrap();
    x.finish().unwrap();
    assert_eq!(p.notifications(1, |_| {}), vec![b"read".to_vec()]);
}

/// Notifications alone: in the order sent; refused when too long or when
/// the session id names no inbox.
fn notifications_alone(p: &Pair) {
    let peer = p.b.session_id();
    for i in 0..100u32 {
        p.a.notify(&peer, &i.to_le_bytes()).unwrap();
    }
    let got = p.notifications(100, |_| {});
    let order: Vec<u32> = got
        .iter()
        .map(|m| u32::from_le_bytes(m[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..100).collect::<Vec<_>>());
    p.a.notify(&peer, &vec![0; MAX_NOTIFICATION]).unwrap();
    assert_eq!(p.notifications(1, |_| {})[0].len(), MAX_NOTIFICATION);
    let e =
        p.a.notify(&peer, &vec![0; MAX_NOTIFICATION + 1])
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::TooLarge, "{e}");
    let bare = peer.rsplit_once('|').unwrap().0;
    let e = p.a.notify(bare, b"x").unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
    // Transfers still reach a bare session id; a notification attached
    // to one is refused before anything is posted.
    p.a.write(bare, &[p.op(0, 0, 8)], WAIT).unwrap();
    let e =
        p.a.post_write(bare, &[p.op(0, 0, 8)], WAIT, Some(b"x"))
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
}

fn exercise(p: &Pair) {
    transfers_from_many_threads(p);
    polled_transfer(p);
    reads(p);
    notifications_alone(p);
    assert!(p.b.notifications().unwrap().is_empty());
}

fn local() -> TransferEngine {
    TransferEngine::open(Backend::Local(LocalConfig::default())).unwrap()
}

#[test]
fn local_engines_offer_the_whole_api() {
    exercise(&Pair::of(local(), local()));
}

#[cfg(feature = "fabric")]
fn fabric(provider: &str) -> TransferEngine {
    // tcp;ofi_rxm on loopback needs its interface named; removing a peer
    // ends its operations (tensorferry-fabric's AV_REMOVE_CLEANUP). Set before
    // this process first uses libfabric.
    std::env::set_var("FI_TCP_IFACE", "lo");
    std::env::set_var("FI_AV_REMOVE_CLEANUP", "1");
    let c = tensorferry_fabric::FabricConfig::new(provider.parse().unwrap());
    let mut options = tensorferry::engine::EngineOptions::default();
    options.notify_host = Some("127.0.0.1".into());
    TransferEngine::open_with(Backend::Fabric(c), options).unwrap()
}

#[cfg(feature = "fabric")]
#[test]
fn fabric_engines_offer_the_whole_api_over_tcp() {
    exercise(&Pair::of(fabric("tcp;ofi_rxm"), fabric("tcp;ofi_rxm")));
}

#[cfg(feature = "fabric")]
#[test]
fn fabric_engines_offer_the_whole_api_over_shm() {
    exercise(&Pair::of(fabric("shm"), fabric("shm")));
}

/// The verbs stand-in behind the engine, with its `stall` knob reachable
/// from the test: the peer stops taking work, which then waits on the
/// queue pair unexecuted, as on a NIC whose peer does not answer.
#[cfg(feature = "verbs-sim")]
mod sim {
    use super::*;
    use std::sync::Arc;
    use tensorferry::core::transport::{
        Capabilities, Completion, ReadOp, Region, Transport, WriteOp,
    };
    use tensorferry_verbs::sim::SimDevice;
    use tensorferry_verbs::{VerbsConfig, VerbsError, VerbsTransport};

    pub struct Stallable {
        t: VerbsTransport<SimDevice>,
        stall: Arc<AtomicBool>,
    }

    impl Stallable {
        fn sync(&self) {
            let on = self.stall.load(Ordering::Relaxed);
            self.t.with_device_mut(|d| d.stall = on);
        }
    }

    impl Transport for Stallable {
        type Error = VerbsError;
        fn session_id(&self) -> &str {
            self.t.session_id()
        }
        fn capabilities(&self) -> Capabilities {
            self.t.capabilities()
        }
        unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, VerbsError> {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.t.register(addr, len) }
        }
        fn deregister(&mut self, region: Region) -> Result<(), VerbsError> {
            self.t.deregister(region)
        }
        fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), VerbsError> {
            self.sync();
            self.t.post_write(write)
        }
        fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), VerbsError> {
            self.sync();
            self.t.post_read(read)
        }
        fn poll_completion(&mut self) -> Option<Completion<VerbsError>> {
            self.sync();
            self.t.poll_completion()
        }
        fn cancel_transfers(&mut self, session: &str) -> Result<(), VerbsError> {
            self.t.cancel_transfers(session)
        }
        fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
            self.t.wake_fd()
        }
    }

    pub fn engine() -> (TransferEngine, Arc<AtomicBool>) {
        let mut c = VerbsConfig::new("sim");
        c.listen = Some("127.0.0.1".into());
        let t = VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).unwrap();
        let stall = Arc::new(AtomicBool::new(false));
        let t = Stallable {
            t,
            stall: Arc::clone(&stall),
        };
        let e = TransferEngine::over(t, "verbs-sim", Default::default()).unwrap();
        (e, stall)
    }
}

#[cfg(feature = "verbs-sim")]
#[test]
fn verbs_engines_offer_the_whole_api_on_the_stand_in() {
    exercise(&Pair::of(sim::engine().0, sim::engine().0));
}

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

    // Past its deadline.
    stall.store(true, Ordering::Relaxed);
    let x =
        p.a.post_write(&peer, &[p.op(0, 0, len)], Duration::from_millis(200), None)
            .unwrap();
    let e = x.wait(WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert!(matches!(e, EngineError::Timeout { .. }), "{e}");
    x.release().unwrap_err();
    p.mem_a.fill(0, len, 2);
    stall.store(false, Ordering::Relaxed);
    // The peer goes on: a new transfer lands, the old one never does.
    p.a.write(&peer, &[p.op(MEM - 8, MEM - 8, 8)], WAIT)
        .unwrap();
    assert!(
        p.mem_b.bytes()[..len].iter().all(|&x| x == 0),
        "a timed-out transfer's bytes landed"
    );

    // Released unfinished.
    stall.store(true, Ordering::Relaxed);
    let x =
        p.a.post_write(&peer, &[p.op(0, 0, len)], WAIT, None)
            .unwrap();
    assert_eq!(
        x.wait(Duration::from_millis(50)).unwrap(),
        TransferState::Pending
    );
    x.release().unwrap_err();
    p.mem_a.fill(0, len, 3);
    stall.store(false, Ordering::Relaxed);
    p.a.write(&peer, &[p.op(MEM - 8, MEM - 8, 8)], WAIT)
        .unwrap();
    assert!(
        p.mem_b.bytes()[..len].iter().all(|&x| x == 0),
        "a released transfer's bytes landed"
    );

    // And a transfer with the peer after that lands whole.
    p.a.write(&peer, &[p.op(0, 0, len)], WAIT).unwrap();
    assert!(expect_pattern(&p.mem_b.bytes()[..len], 3));
}

/// 100,000 notifications, alone and attached to transfers, from two
/// threads, while the receiver reads them: none is lost or repeated, and
/// each thread's arrive in the order it sent them.
#[test]
fn none_of_100_000_notifications_is_lost() {
    const N: u32 = 100_000;
    const THREADS: u32 = 2;
    let p = Pair::of(local(), local());
    let peer = p.b.session_id();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, peer) = (&p, &peer);
            s.spawn(move || {
                for i in 0..N / THREADS {
                    let mut m = [0u8; 8];
                    m[..4].copy_from_slice(&t.to_le_bytes());
                    m[4..].copy_from_slice(&i.to_le_bytes());
                    if i % 100 == 0 {
                        // Attached: sent before the transfer is final, so
                        // it keeps its place in the thread's order.
                        let op = p.op(t as usize * 64, t as usize * 64, 64);
                        p.a.post_write(peer, &[op], WAIT, Some(&m))
                            .unwrap()
                            .finish()
                            .unwrap();
                    } else {
                        p.a.notify(peer, &m).unwrap();
                    }
                }
            });
        }
        s.spawn(|| {
            let mut next = [0u32; THREADS as usize];
            let mut seen = 0;
            let until = Instant::now() + Duration::from_secs(120);
            while seen < N {
                assert!(Instant::now() < until, "{seen} of {N} notifications");
                let got = p.b.notifications().unwrap();
                if got.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                }
                for note in got {
                    let t = u32::from_le_bytes(note.message[..4].try_into().unwrap());
                    let i = u32::from_le_bytes(note.message[4..].try_into().unwrap());
                    assert_eq!(
                        i, next[t as usize],
                        "thread {t}'s notifications out of order"
                    );
                    next[t as usize] += 1;
                    seen += 1;
                }
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    assert!(done.load(Ordering::Relaxed));
    assert!(p.b.notifications().unwrap().is_empty());
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
    use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

    let engine = fabric("tcp;ofi_rxm");
    let len = 16usize << 20;
    let mut config = FabricConfig::new(Provider::Named("tcp;ofi_rxm".into()));
    config.delivery = DeliveryMode::Complete;
    let mut receiver = FabricTransport::with_pool(&config, len).unwrap();
    let (base, pool_len) = (receiver.pool_ptr(), receiver.pool_len());
    // SAFETY: the transport's own pool, registered for its life.
    let _region = unsafe { receiver.register(base, pool_len) }.unwrap();
    let placed = || {
        // SAFETY: compared only; read while the receiver does not drive
        // its queue or after it placed what it will.
        unsafe { std::slice::from_raw_parts(base, pool_len) }.to_vec()
    };
    let src = Buf::new(len);
    src.fill(0, len, 1);
    // SAFETY: `src` outlives the engine (dropped after it, below).
    unsafe { engine.register(src.addr(), len as u64) }.unwrap();
    let to = receiver.session_id().to_owned();
    let op = |len: usize| Op {
        src: src.addr(),
        dst: base as u64,
        len: len as u64,
    };
    // Connected first (retried: a first connect on a loaded machine may
    // take longer than the plane's write timeout).
    let mut tries = 0;
    while let Err(e) = engine.write(&to, &[op(8)], WAIT) {
        tries += 1;
        assert!(tries < 5, "{e}");
    }
    receiver.hold_progress(true);
    let x = engine
        .post_write(&to, &[op(len)], Duration::from_millis(300), None)
        .unwrap();
    let e = x.wait(WAIT).unwrap_err();
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert_eq!(x.state(), TransferState::Failed);
    drop(x);
    src.fill(0, len, 2);
    receiver.hold_progress(false);
    std::thread::sleep(Duration::from_millis(500));
    // What landed is the first source's or nothing, never the second's.
    let now = placed();
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
    assert!(expect_pattern(&placed()[..4096], 2));
    drop(engine);
}
