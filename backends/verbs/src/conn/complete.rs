//! Completions and deadlines: reaping the CQ, finishing transfers, and
//! failing the connections whose exchange or transfers are late.

use std::time::Instant;

use tensorferry_core::transport::Completion;

use super::{forget, front_op, verb, ConnBook, ConnState, POLL_BATCH};
use crate::device::{Device, Wc};
use crate::error::VerbsError;
use crate::status::WcStatus;

impl<D: Device> ConnBook<D> {
    /// Reaps completions; returns the next finished transfer. Reading no
    /// clock, it leaves deadlines to [`ConnBook::sweep`].
    pub fn poll(&mut self) -> Option<Completion<VerbsError>> {
        // The caller is looking: whatever is finished, it will see.
        self.news = false;
        if let Some(c) = self.done.pop_front() {
            return Some(c);
        }
        self.reap();
        if self.done.is_empty() {
            // About to report nothing, so the caller may sleep: arm, then
            // poll once more (a completion after arming raises an event,
            // one before it is found by this poll). Arming only here keeps
            // its syscall off the path of a busy CQ.
            if let Err(e) = self.device.arm() {
                if !self.arm_failed {
                    tracing::warn!(
                        verb = e.verb.name(),
                        errno = e.errno,
                        "verbs: completion events unavailable; completions are found by polling"
                    );
                    self.arm_failed = true;
                }
            }
            self.reap();
        }
        if self.cq_blocked {
            self.unblock();
        }
        self.done.pop_front()
    }

    /// Reports a finished transfer.
    pub(super) fn finish(&mut self, c: Completion<VerbsError>) {
        self.done.push_back(c);
        self.news = true;
    }

    /// True (once) if transfers finished since the last call: the side
    /// channel's thread then wakes the caller, who would not otherwise
    /// look.
    pub fn take_news(&mut self) -> bool {
        std::mem::take(&mut self.news)
    }

    /// Polls one batch of completions and applies them.
    pub(super) fn reap(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        if let Err(e) = self.device.poll(&mut wcs, POLL_BATCH) {
            // A CQ in error cannot say which transfer failed, nor show a
            // marker: every connection fails, by the last resort.
            self.destroy_every(|peer| verb(e, peer));
        }
        for wc in &wcs {
            self.on_wc(wc);
        }
        self.wcs = wcs;
    }

    pub(super) fn on_wc(&mut self, wc: &Wc) {
        let conn_id = (wc.wr_id >> 32) as u32;
        let sig = self.signals.remove(&wc.wr_id);
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return; // of a queue pair destroyed already
        };
        if let Some(s) = &sig {
            // Success or flush, the work it covers is over.
            conn.window.complete(s.covered);
            self.in_flight = self.in_flight.saturating_sub(s.covered);
        }
        if let Some(ending) = &conn.ending {
            if ending.marker == Some(wc.wr_id) {
                // Every work request before the marker has completed.
                return self.settle(conn_id, None);
            }
        }
        if wc.status != WcStatus::SUCCESS {
            if conn.ending.is_none() {
                let e = VerbsError::Completion {
                    op: front_op(&conn.transfers, &self.transfers),
                    peer: conn.peer.clone(),
                    status: wc.status,
                    vendor_err: wc.vendor_err,
                };
                self.fail_conn(conn_id, e);
            }
            return;
        }
        // A transfer that finished before its connection ended finished.
        if let Some(wid) = sig.and_then(|s| s.completes) {
            forget(&mut conn.transfers, wid);
            if let Some(w) = self.transfers.remove(&wid) {
                self.finish(Completion {
                    cookie: w.cookie,
                    result: Ok(()),
                });
            }
        }
        self.pump(conn_id);
    }

    /// Fails the connections whose exchange or transfers are past their
    /// deadlines, stamping the deadlines of those seen for the first time;
    /// returns the next finished transfer.
    pub fn sweep(&mut self, now: Instant) -> Option<Completion<VerbsError>> {
        let write_timeout = self.limits.write_timeout;
        for w in self.transfers.values_mut() {
            w.deadline.get_or_insert(now + write_timeout);
        }
        self.sweep_ending(now);
        let mut failing = Vec::new();
        for conn in self.conns.values_mut().filter(|c| c.ending.is_none()) {
            let connecting = matches!(conn.state, ConnState::Wanted | ConnState::Requested);
            let since = *conn.since.get_or_insert(now);
            match conn.state {
                _ if connecting && now.duration_since(since) >= self.limits.connect_timeout => {
                    failing.push((
                        conn.id,
                        VerbsError::ConnectTimeout {
                            peer: conn.peer.clone(),
                            after: self.limits.connect_timeout,
                        },
                    ));
                }
                _ => {
                    let late = conn.transfers.iter().any(|w| {
                        self.transfers
                            .get(w)
                            .and_then(|w| w.deadline)
                            .is_some_and(|d| d <= now)
                    });
                    if late {
                        failing.push((
                            conn.id,
                            VerbsError::Timeout {
                                op: front_op(&conn.transfers, &self.transfers),
                                peer: conn.peer.clone(),
                                after: self.limits.write_timeout,
                            },
                        ));
                    }
                }
            }
        }
        for (id, e) in failing {
            self.fail_conn(id, e);
        }
        self.done.pop_front()
    }

    /// True if completions cannot raise events and transfers are pending: the
    /// caller must keep polling rather than wait.
    pub fn needs_polling(&self) -> bool {
        self.arm_failed && !self.transfers.is_empty()
    }

    /// The connection's state, by peer (for tests and diagnostics).
    pub fn state_of(&self, peer: &str) -> Option<ConnState> {
        self.by_peer
            .get(peer)
            .and_then(|id| self.conns.get(id))
            .map(|c| c.state)
    }
}
