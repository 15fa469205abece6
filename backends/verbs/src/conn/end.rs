//! Ending connections, so that a completion is final: a connection that
//! fails or whose transfers are cancelled stops its queue pair (ERR), posts
//! the marker, and completes its unfinished transfers (writes and reads)
//! only once the marker
//! completed, when nothing its queue pair held runs any more. A connection
//! that never ran work is removed at once; one whose marker does not come
//! has its queue pair destroyed, the last resort.

use std::time::Instant;

use tensorferry_core::transport::Completion;

use super::{front_op, ConnBook, Ending, Outcome, FLUSH_WAIT};
use crate::attrs::QpStep;
use crate::device::{Device, RdmaOp};
use crate::error::VerbsError;

impl<D: Device> ConnBook<D> {
    /// Fails a connection: it ends, and its unfinished transfers fail, the
    /// first with `first`, the others as abandoned because of it.
    pub(super) fn fail_conn(&mut self, conn_id: u32, first: VerbsError) {
        self.end_conn(conn_id, Outcome::Failed(first));
    }

    /// Ends the transfers with `peer` that have not completed
    /// (`Transport::cancel_transfers`): its connection ends, and they
    /// complete as cancelled once it has ended ([`ConnBook::ending`] says
    /// when).
    pub fn cancel(&mut self, peer: &str) {
        if let Some(&id) = self.by_peer.get(peer) {
            self.end_conn(id, Outcome::Cancelled);
        }
    }

    /// Ends every connection, their unfinished transfers failing as broken
    /// for `why` (a registered region goes, the transport closes).
    pub fn end_all(&mut self, why: &str) {
        let all: Vec<(u32, String, RdmaOp)> = self
            .conns
            .values()
            .filter(|c| c.ending.is_none())
            .map(|c| {
                (
                    c.id,
                    c.peer.clone(),
                    front_op(&c.transfers, &self.transfers),
                )
            })
            .collect();
        for (id, peer, op) in all {
            self.fail_conn(
                id,
                VerbsError::Broken {
                    op,
                    peer,
                    why: why.to_owned(),
                },
            );
        }
    }

    /// True while a connection to `peer` (any connection, for `None`) is
    /// ending: work its queue pair held may still run, and its transfers have
    /// not completed.
    pub fn ending(&self, peer: Option<&str>) -> bool {
        self.conns
            .values()
            .any(|c| c.ending.is_some() && peer.is_none_or(|p| c.peer == p))
    }

    /// Moves ending connections on: reaps completions (a connection whose
    /// marker completes is removed, its transfers completed) and posts the
    /// markers that waited for room in the CQ.
    pub fn progress_ends(&mut self) {
        self.reap();
        if self.cq_blocked {
            self.unblock();
        }
    }

    /// The last resort for the ending connections (to `peer`, or all)
    /// whose marker has not completed: their queue pairs are destroyed
    /// (`ibv_destroy_qp` returns once the device has let go of the queue
    /// pair, so nothing of it runs afterwards) and their transfers complete.
    pub fn abandon_ending(&mut self, peer: Option<&str>) {
        let stuck: Vec<(u32, String)> = self
            .conns
            .values()
            .filter(|c| c.ending.is_some() && peer.is_none_or(|p| c.peer == p))
            .map(|c| (c.id, c.peer.clone()))
            .collect();
        for (id, peer) in stuck {
            self.abandon(id, &peer);
        }
    }

    fn abandon(&mut self, conn_id: u32, peer: &str) {
        tracing::warn!(
            peer = %peer,
            after = ?FLUSH_WAIT,
            "verbs: a queue pair in error did not complete its marker; destroying it instead"
        );
        self.settle(conn_id, None);
    }

    /// The ending connections whose marker is late (their deadline stamped
    /// at the first sweep that sees them) go by the last resort.
    pub(super) fn sweep_ending(&mut self, now: Instant) {
        let mut late = Vec::new();
        for c in self.conns.values_mut() {
            if let Some(e) = c.ending.as_mut() {
                let since = *e.since.get_or_insert(now);
                if now.duration_since(since) >= FLUSH_WAIT {
                    late.push((c.id, c.peer.clone()));
                }
            }
        }
        for (id, peer) in late {
            self.abandon(id, &peer);
        }
    }

    /// Completions cannot be read (the CQ is in error), so no marker can
    /// be seen: every connection goes by the last resort, its unfinished
    /// transfers failing with the error `make` gives for its peer (or the one
    /// it was ending with).
    pub(super) fn destroy_every(&mut self, make: impl Fn(&str) -> VerbsError) {
        let all: Vec<(u32, String, bool)> = self
            .conns
            .values()
            .map(|c| (c.id, c.peer.clone(), c.ending.is_some()))
            .collect();
        for (id, peer, ending) in all {
            let outcome = (!ending).then(|| Outcome::Failed(make(&peer)));
            self.settle(id, outcome);
        }
    }

    /// Ends a connection: the peer's name leaves it (the next transfer with
    /// the peer connects anew) and its queued transfers will never be
    /// posted. One
    /// whose queue pair never ran work is removed at once; otherwise its
    /// queue pair goes to ERR, and it is ending until the marker posted
    /// after that completes. An ending connection keeps the outcome it
    /// ends with.
    fn end_conn(&mut self, conn_id: u32, outcome: Outcome) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if conn.ending.is_some() {
            return;
        }
        if let Outcome::Failed(e) = &outcome {
            tracing::warn!(peer = %conn.peer, error = %e, transfers = conn.transfers.len(), "verbs connection failed");
        }
        if self.by_peer.get(&conn.peer) == Some(&conn_id) {
            self.by_peer.remove(&conn.peer);
        }
        conn.queue.clear();
        let posted = conn.posted;
        let Some(qp) = conn.qp.as_mut().filter(|_| posted) else {
            return self.settle(conn_id, Some(outcome));
        };
        if let Err(e) = self.device.modify(qp, &QpStep::Error) {
            // The marker still ends it: whatever the queue pair's state,
            // its completion comes after every earlier work request's.
            tracing::warn!(peer = %conn.peer, error = %e, "verbs: a queue pair did not go to the error state; waiting for its work to complete");
        }
        conn.ending = Some(Ending {
            outcome,
            marker: None,
            since: None,
        });
        self.markers_waiting += 1;
        self.post_marker(conn_id);
    }

    /// Posts an ending connection's marker, if the CQ has room for its
    /// completion (otherwise it waits, ahead of every transfer, for
    /// completions to make room; so it does when the send queue is full).
    /// A marker the device refuses otherwise leaves the last resort.
    pub(super) fn post_marker(&mut self, conn_id: u32) {
        if self.in_flight >= self.cq_capacity {
            self.cq_blocked = true;
            return;
        }
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let (Some(qp), Some(ending)) = (conn.qp.as_mut(), conn.ending.as_mut()) else {
            return;
        };
        if ending.marker.is_some() {
            return;
        }
        let wr_id = (u64::from(conn.id) << 32) | u64::from(conn.next_seq);
        conn.next_seq = conn.next_seq.wrapping_add(1);
        match self.device.post_marker(qp, wr_id) {
            Ok(()) => {
                ending.marker = Some(wr_id);
                self.markers_waiting = self.markers_waiting.saturating_sub(1);
                self.in_flight += 1;
            }
            // A full send queue frees its slots as the flushes before the
            // marker are polled: it is tried again once completions come
            // (within `FLUSH_WAIT`).
            Err(e) if e.errno == libc::ENOMEM => self.cq_blocked = true,
            Err(e) => {
                tracing::warn!(peer = %conn.peer, error = %e, "verbs: cannot post the marker that ends a queue pair; destroying it instead");
                self.settle(conn_id, None);
            }
        }
    }

    /// Completions made room in the CQ: the markers that waited for it go
    /// first, then the transfers of every ready connection.
    pub(super) fn unblock(&mut self) {
        self.cq_blocked = false;
        let waiting: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.ending.as_ref().is_some_and(|e| e.marker.is_none()))
            .map(|c| c.id)
            .collect();
        for id in waiting {
            self.post_marker(id);
        }
        let ready: Vec<u32> = self
            .conns
            .values()
            .filter(|c| c.state == super::ConnState::Ready && !c.queue.is_empty())
            .map(|c| c.id)
            .collect();
        for id in ready {
            self.pump(id);
        }
    }

    /// Removes a connection and completes its unfinished transfers: with the
    /// outcome it was ending with, or else `outcome` (none: nothing to
    /// complete them with, which only a caller that knows it ends nothing
    /// passes).
    pub(super) fn settle(&mut self, conn_id: u32, outcome: Option<Outcome>) {
        let Some(mut conn) = self.close_conn(conn_id) else {
            return;
        };
        let Some(outcome) = conn.ending.take().map(|e| e.outcome).or(outcome) else {
            return;
        };
        let peer = conn.peer;
        let mut first = match outcome {
            Outcome::Cancelled => {
                tracing::info!(peer = %peer, transfers = conn.transfers.len(), "verbs: transfers cancelled; their queue pair has ended");
                None
            }
            // It fails the oldest transfer first, a write or a read.
            Outcome::Failed(first) => {
                Some(first.for_op(front_op(&conn.transfers, &self.transfers)))
            }
        };
        let why = first.as_ref().map(ToString::to_string);
        for wid in conn.transfers.drain(..) {
            let Some(w) = self.transfers.remove(&wid) else {
                continue;
            };
            let e = match (&why, first.take()) {
                (_, Some(first)) => first,
                (Some(why), None) => VerbsError::Broken {
                    op: w.op,
                    peer: peer.clone(),
                    why: why.clone(),
                },
                (None, None) => VerbsError::Cancelled {
                    op: w.op,
                    peer: peer.clone(),
                },
            };
            self.finish(Completion {
                cookie: w.cookie,
                result: Err(e),
            });
        }
    }
}
