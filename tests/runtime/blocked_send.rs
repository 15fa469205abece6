//! A control send that blocks (as one to a coordinator that stopped
//! reading does) holds up no other thread's call.

use std::sync::{mpsc, Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tensorferry::runtime::{DataPlane, InstanceNodeConfig, Prealloc};
use tensorferry_core::transport::{ControlChannel, ControlSend, FaultKind};
use tensorferry_shm::UdsChannel;

use super::{check_bytes, coordinator, instance, send, SECOND};
use crate::common::endpoint;

/// A gate on a channel's sends: shut, a send waits at it, as a send to a
/// coordinator that stopped reading waits for ZeroMQ's send timeout.
#[derive(Default)]
struct Gate {
    /// Shut or not, and how many sends wait at it.
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, usize)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_shut(&self, shut: bool) {
        self.lock().0 = shut;
        self.changed.notify_all();
    }

    fn pass(&self) {
        let mut g = self.lock();
        g.1 += 1;
        self.changed.notify_all();
        while g.0 {
            g = self.changed.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.1 -= 1;
    }

    /// True once a send waits at the gate, within `patience`.
    fn has_a_send_waiting(&self, patience: Duration) -> bool {
        let g = self.lock();
        let (g, _) = self
            .changed
            .wait_timeout_while(g, patience, |g| g.1 == 0)
            .unwrap_or_else(PoisonError::into_inner);
        g.1 > 0
    }
}

/// Opens the gate when dropped, a failed assertion's unwinding included,
/// so that the sends waiting at it end.
struct OpenOnDrop<'a>(&'a Gate);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_shut(false);
    }
}

/// A control channel's sending side behind a [`Gate`].
struct Gated<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S: ControlSend> ControlSend for Gated<S> {
    type Error = S::Error;

    fn fault_kind(error: &S::Error) -> FaultKind {
        S::fault_kind(error)
    }

    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), S::Error> {
        self.gate.pass();
        self.inner.send(to, parts)
    }
}

#[test]
fn a_control_send_that_blocks_holds_up_no_other_threads_call() {
    let coord = coordinator(&["encoder", "decoder"]);
    let dec = instance("decoder", &coord, Prealloc::NONE);
    let gate = Arc::new(Gate::default());
    let (tx, rx) = UdsChannel::bind(&endpoint("encoder")).unwrap().split();
    let gated = Gated {
        inner: tx,
        gate: Arc::clone(&gate),
    };
    let enc = DataPlane::default()
        .start_instance(
            &InstanceNodeConfig::new("encoder", coord.endpoint()),
            64 << 20,
            (gated, rx),
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    let enc = &enc;
    std::thread::scope(|s| {
        let open = OpenOnDrop(&gate);
        gate.set_shut(true);
        // This thread's commit sends `transfer_staged`, which waits at the
        // gate.
        let first = s.spawn(move || send(enc, "r1", 1));
        assert!(
            gate.has_a_send_waiting(30 * SECOND),
            "no send reached the gate"
        );
        // Meanwhile another thread's calls take the node's state: its
        // figures, and a request of its own staged, filled and committed.
        let (returned, calls) = mpsc::channel();
        s.spawn(move || {
            let _ = enc.stats();
            send(enc, "r2", 2);
            let _ = returned.send(());
        });
        assert!(
            calls.recv_timeout(30 * SECOND).is_ok(),
            "stats() and another request's commit waited for a blocked send"
        );
        drop(open);
        first.join().unwrap();
    });
    // With the gate open, both requests went out, and both hand-offs end
    // with every byte in place.
    let mut got = Vec::new();
    for _ in 0..2 {
        let d = dec.recv(5 * SECOND).expect("a delivery");
        let seed = match d.id() {
            "r1" => 1,
            "r2" => 2,
            other => panic!("unexpected request {other}"),
        };
        check_bytes(&d, seed);
        got.push(d.id().to_owned());
        d.release();
    }
    got.sort();
    assert_eq!(got, ["r1", "r2"]);
    for _ in 0..2 {
        assert!(enc.next_outcome(5 * SECOND).expect("an outcome").sent);
    }
}
