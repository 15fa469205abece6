//! What the engine's handles and its driver thread share: the transport
//! and its regions (the plane) behind one lock, the table of transfers
//! behind another, the notification inbox, and what either side does with
//! them: collect completions, run the chores the table leaves to do
//! outside its lock, and wait for transfers to finish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tensorferry_core::transport::{FaultKind, Region, Transport};

use crate::engine::notify::Notifier;
use crate::engine::table::{Chores, Failure, Id, Peer, Table};

pub(super) struct Plane<T> {
    pub(super) transport: T,
    pub(super) regions: Vec<Region>,
}

impl<T> Plane<T> {
    /// The registered region that holds `len` bytes at `addr`.
    pub(super) fn region_of(&self, addr: u64, len: u64) -> Option<Region> {
        self.regions.iter().copied().find(|r| {
            addr >= r.addr
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= r.addr + r.len)
        })
    }
}

pub(super) struct Shared<T> {
    pub(super) plane: Mutex<Plane<T>>,
    pub(super) table: Mutex<Table>,
    pub(super) finished: Condvar,
    /// Threads waiting on `finished`, counted under the table's lock
    /// before they wait: a finisher that sees none skips the wake-up (a
    /// system call), and one that sees some was ordered after their count
    /// by that lock.
    pub(super) waiters: std::sync::atomic::AtomicUsize,
    pub(super) notifier: Notifier,
    pub(super) stop: AtomicBool,
}

pub(super) fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn failure<T: Transport>(verb: &'static str, e: &T::Error) -> Failure {
    Failure::Op {
        verb,
        kind: T::fault_kind(e),
        message: e.to_string(),
    }
}

impl<T: Transport> Shared<T> {
    /// Polls the transport, hands what completed to its transfers, and
    /// does what that leaves to do.
    pub(super) fn collect(&self) {
        let mut chores = Chores::default();
        {
            let mut p = lock(&self.plane);
            // The table's lock is taken inside the plane's (the one order
            // allowed), and only once something completed.
            let mut table = None;
            while let Some(c) = p.transport.poll_completion() {
                let t = table.get_or_insert_with(|| lock(&self.table));
                t.complete(
                    c.cookie,
                    c.result.map_err(|e| failure::<T>("transfer", &e)),
                    &mut chores,
                );
            }
            drop(table);
            // Delivery-complete data planes: arrivals are not counted.
            while p.transport.poll_landed().is_some() {}
        }
        self.run(chores);
    }

    /// Wakes the threads waiting on `finished`, if there are any.
    fn wake_waiters(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.finished.notify_all();
        }
    }

    /// Waits on `finished` for at most `wait`, counted as a waiter.
    pub(super) fn wait_finished<'a>(
        &self,
        t: MutexGuard<'a, Table>,
        wait: Duration,
    ) -> MutexGuard<'a, Table> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let t = self
            .finished
            .wait_timeout(t, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        t
    }

    /// Does what the table left to do outside its lock, until nothing is
    /// left: wakes waiters, ends peers' operations, sends notifications.
    pub(super) fn run(&self, mut chores: Chores) {
        loop {
            if chores.finished {
                self.wake_waiters();
            }
            let mut next = Chores::default();
            if !chores.end.is_empty() {
                let mut ended: Vec<&str> = Vec::new();
                {
                    let mut p = lock(&self.plane);
                    for peer in &chores.end {
                        if ended.contains(&peer.plane.as_str()) {
                            continue;
                        }
                        ended.push(&peer.plane);
                        if let Err(e) = p.transport.cancel_transfers(&peer.plane) {
                            tracing::error!(
                                peer = %peer.session,
                                error = %e,
                                "cannot end the operations of a transfer; it stays pending until they finish"
                            );
                        }
                    }
                }
                // Their completions, final by the seam's contract.
                self.collect();
            }
            if !chores.send.is_empty() {
                let from = self.session_id();
                let outcomes: Vec<(Id, Result<(), Failure>)> = chores
                    .send
                    .drain(..)
                    .map(|(id, attached)| {
                        let outcome = match &attached.peer.notify {
                            Some(to) => {
                                // Never waits: this thread may be the one
                                // that drives every other transfer.
                                self.notifier
                                    .send(&from, to, &attached.message, None)
                                    .map_err(|e| Failure::Op {
                                        verb: "notify",
                                        kind: e.kind(),
                                        message: e.to_string(),
                                    })
                            }
                            // Refused when posted; kept for a peer that
                            // lost its endpoint in between.
                            None => Err(no_endpoint(&attached.peer)),
                        };
                        (id, outcome)
                    })
                    .collect();
                let mut t = lock(&self.table);
                for (id, outcome) in outcomes {
                    t.sent(id, outcome, &mut next);
                }
            }
            if !next.finished && next.send.is_empty() && next.end.is_empty() {
                return;
            }
            chores = next;
        }
    }

    pub(super) fn session_id(&self) -> String {
        let plane = lock(&self.plane);
        crate::engine::join_session(plane.transport.session_id(), self.notifier.address())
    }
}

/// Why a notification to `peer` cannot be sent.
pub(super) fn no_endpoint(peer: &Peer) -> Failure {
    Failure::Op {
        verb: "notify",
        kind: FaultKind::UnknownPeer,
        message: format!(
            "session id {:?} names no notification endpoint (it is not a ferry engine's)",
            peer.session
        ),
    }
}
