//! The transfer engine's connector API on every data plane: transfers with
//! handles posted from many threads, one-sided reads, notifications
//! (attached and alone, in order, none lost, a peer that reads none
//! failing only the sends to it), and what an ended transfer
//! guarantees. Two engines in this process, over the local plane, the
//! libfabric plane (`tcp;ofi_rxm` and `shm`) and the verbs stand-in. The
//! tests are in `engine_api/`, one module a topic; the memory, the pair of
//! engines and the engines of each plane they share are here.

#[path = "engine_api/inbox_guard.rs"]
mod inbox_guard;
#[path = "engine_api/slow_peer.rs"]
mod slow_peer;
#[path = "engine_api/unfinished.rs"]
mod unfinished;
#[path = "engine_api/whole_api.rs"]
mod whole_api;

#[cfg(feature = "fabric")]
#[path = "common/held_receiver.rs"]
mod held_receiver;
#[cfg(feature = "verbs-sim")]
#[path = "common/hooked.rs"]
mod hooked;
#[path = "common/stranger.rs"]
mod stranger;
#[cfg(feature = "fabric")]
use held_receiver::HeldReceiver;

use std::time::{Duration, Instant};

use tensorferry::engine::{DataPlane, LocalConfig, Op, TransferEngine};

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

fn local() -> TransferEngine {
    TransferEngine::open(DataPlane::Local(LocalConfig::default())).unwrap()
}

#[cfg(feature = "fabric")]
fn fabric(provider: &str) -> TransferEngine {
    // tcp;ofi_rxm on loopback needs its interface named.
    std::env::set_var("FI_TCP_IFACE", "lo");
    let c = tensorferry_fabric::FabricConfig::new(provider.parse().unwrap());
    let mut options = tensorferry::engine::EngineConfig::default();
    options.notify_host = Some("127.0.0.1".into());
    TransferEngine::open_with(DataPlane::Fabric(c), options).unwrap()
}

/// The verbs stand-in behind the engine, with its `stall` knob reachable
/// from the test: the peer stops taking work, which then waits on the
/// queue pair unexecuted, as on a NIC whose peer does not answer.
#[cfg(feature = "verbs-sim")]
mod sim {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tensorferry_verbs::sim::SimDevice;
    use tensorferry_verbs::{VerbsConfig, VerbsTransport};

    use crate::hooked::{Hooked, Hooks};

    /// Hooks that pass the test's `stall` knob on to the device before
    /// each post and poll.
    pub struct Stall(Arc<AtomicBool>);

    impl Stall {
        fn sync(&self, t: &VerbsTransport<SimDevice>) {
            let on = self.0.load(Ordering::Relaxed);
            t.with_device_mut(|d| d.stall = on);
        }
    }

    impl Hooks<VerbsTransport<SimDevice>> for Stall {
        fn writing(&mut self, t: &VerbsTransport<SimDevice>) {
            self.sync(t);
        }
        fn reading(&mut self, t: &VerbsTransport<SimDevice>) {
            self.sync(t);
        }
        fn polling(&mut self, t: &VerbsTransport<SimDevice>) {
            self.sync(t);
        }
    }

    pub fn engine() -> (TransferEngine, Arc<AtomicBool>) {
        let mut c = VerbsConfig::new("sim");
        c.listen = Some("127.0.0.1".into());
        let t = VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).unwrap();
        let stall = Arc::new(AtomicBool::new(false));
        let t = Hooked {
            hooks: Stall(Arc::clone(&stall)),
            inner: t,
        };
        let e = TransferEngine::over(t, "verbs-sim", Default::default()).unwrap();
        (e, stall)
    }
}
