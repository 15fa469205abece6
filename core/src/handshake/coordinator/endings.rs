//! How a transfer ends: capacity released once, failures answered on the
//! wire, timeouts.

use super::*;

impl<'s, const P: usize> Coordinator<'s, P> {
    /// Gives the receiver's capacity back (once: the ticket is taken).
    pub(super) fn release(&mut self, i: usize) {
        let Some(t) = self.transfers[i].as_mut() else {
            return;
        };
        let (ticket, receiver) = (t.ticket.take(), t.receiver.take());
        if let (Some(ticket), Some(r)) = (ticket, receiver) {
            if let Some(m) = self.member_mut(r) {
                let _ = m.capacity.release(ticket);
            }
        }
        if let Some(t) = self.transfers[i].as_mut() {
            t.receiver = receiver;
        }
    }

    /// Ends transfer `i` after `transfer_done`: capacity and preallocated
    /// slot back, record gone.
    pub(super) fn end(&mut self, _now: Instant, i: usize) {
        self.release(i);
        let Some(t) = self.transfers[i].take() else {
            return;
        };
        self.finished
            .bury_owned(t.id, Leg::FromRole(t.sender_role), t.sender.epoch);
        if let (Some(slot_id), Some(r)) = (t.prealloc, t.receiver) {
            if let Some(m) = self.member_mut(r) {
                let _ = m.prealloc.give_back(slot_id);
            }
        }
    }

    /// Fails transfer `i`: aborts to everyone involved, capacity back,
    /// preallocated slot parked, record gone.
    pub(super) fn fail(&mut self, now: Instant, i: usize, reason: FailReason) {
        self.release(i);
        let Some(t) = self.transfers[i].take() else {
            return;
        };
        self.finished
            .bury_owned(t.id, Leg::FromRole(t.sender_role), t.sender.epoch);
        let abort = OutMsg::Abort {
            id: t.id,
            reason: reason.as_str(),
            source_role: t.sender_role,
        };
        if t.phase != Phase::Ready {
            if let Some(peer) = self.member(t.sender).map(|m| m.peer) {
                self.send(peer, abort);
            }
        }
        if let Some(r) = t.receiver {
            if let Some(peer) = self.member(r).map(|m| m.peer) {
                self.send(peer, abort);
            }
            if let Some(slot_id) = t.prealloc {
                let held = t.phase == Phase::Ready;
                let wait = if held {
                    self.config.late_done_wait
                } else {
                    self.config.quarantine
                };
                let parked = Parked {
                    member: r,
                    slot_id,
                    id: t.id,
                    until: now + wait,
                    held,
                };
                // No room to park: keep the slot taken rather than risk a
                // write landing in a reused slot. It comes back when the
                // instance registers again.
                if let Some(p) = self.parked.iter_mut().find(|p| p.is_none()) {
                    *p = Some(parked);
                }
            }
        }
        self.stats.failed += 1;
        self.event(CoordinatorEvent::Failed {
            id: t.id,
            leg: t.sender_role,
            reason,
        });
    }

    /// Fails what has waited too long, retries what waited for backoff, and
    /// returns parked slots whose quarantine is over.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.transfers.len() {
            let Some(t) = self.transfers[i].as_ref() else {
                continue;
            };
            if t.deadline <= now {
                let reason = match t.phase {
                    Phase::Queued { .. } => FailReason::QueueTimeout,
                    Phase::Allocating => FailReason::AllocTimeout,
                    Phase::Pushing => FailReason::PushTimeout,
                    Phase::Ready => FailReason::DoneTimeout,
                };
                self.fail(now, i, reason);
            }
        }
        for pi in 0..self.parked.len() {
            let Some(p) = self.parked[pi] else { continue };
            if p.until <= now {
                self.parked[pi] = None;
                if let Some(m) = self.member_mut(p.member) {
                    let _ = m.prealloc.give_back(p.slot_id);
                }
            }
        }
        self.dispatch_queued(now);
    }
}
