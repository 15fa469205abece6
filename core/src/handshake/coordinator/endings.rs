//! How a transfer ends: capacity released once, failures answered on the
//! wire, timeouts.

use super::*;

impl<'s> Coordinator<'s> {
    /// Gives the receiver's capacity back (once: the ticket is taken).
    pub(super) fn release(&mut self, i: usize) {
        let Some(mut t) = self.transfers.records.get_mut(i) else {
            return;
        };
        let (ticket, receiver) = (t.ticket.take(), t.receiver);
        drop(t);
        if let (Some(ticket), Some(r)) = (ticket, receiver) {
            if let Some(mut m) = self.member_mut(r) {
                let _ = m.capacity.release(ticket);
            }
            self.rank(r.index);
        }
    }

    /// Gives preallocated slot `slot_id` back to member `r`.
    pub(super) fn give_back(&mut self, r: MemberRef, slot_id: u64) {
        if let Some(mut m) = self.member_mut(r) {
            let _ = m.prealloc.give_back(slot_id);
        }
        self.rank(r.index);
    }

    /// Takes transfer `i` out, however it ended: its capacity back, out of
    /// its queue, its record gone and its leg remembered (so that a late
    /// duplicate is not taken for a new request).
    fn take_out(&mut self, i: usize) -> Option<Transfer> {
        self.release(i);
        self.unqueue(i);
        let t = self.transfers.records.remove(i)?;
        self.remains
            .finished
            .bury_owned(t.id, Leg::FromRole(t.sender_role), t.sender.epoch);
        Some(t)
    }

    /// Ends transfer `i` after `transfer_done`: capacity and preallocated
    /// slot back, record gone.
    pub(super) fn end(&mut self, _now: Instant, i: usize) {
        let Some(t) = self.take_out(i) else {
            return;
        };
        if let (Some(slot_id), Some(r)) = (t.prealloc, t.receiver) {
            self.give_back(r, slot_id);
        }
    }

    /// How long a preallocated slot a failed write of `sender`'s may
    /// still land in is parked: the configured quarantine, or longer where
    /// its writes may land later (a sender already gone: the longest any
    /// registration may state).
    pub(super) fn quarantine(&self, sender: MemberRef) -> Duration {
        let lifetime = self
            .member(sender)
            .map_or(self.config.max_write_lifetime, |m| m.write_lifetime);
        self.config
            .quarantine
            .max(lifetime.saturating_add(self.config.message_delay))
    }

    /// Fails transfer `i`: aborts to everyone involved, capacity back,
    /// preallocated slot parked, record gone.
    pub(super) fn fail(&mut self, now: Instant, i: usize, reason: FailReason) {
        let Some(t) = self.take_out(i) else {
            return;
        };
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
                    self.quarantine(t.sender)
                };
                // No room to park: keep the slot taken rather than risk a
                // write landing in a reused slot. It comes back when the
                // instance registers again.
                let _ = self.remains.parked.insert(Parked {
                    member: r,
                    slot_id,
                    id: t.id,
                    until: now + wait,
                    held,
                });
            }
        }
        self.stats.failed += 1;
        self.event(CoordinatorEvent::Failed {
            id: t.id,
            leg: t.sender_role,
            reason,
        });
    }

    /// Fails what has waited too long, queues again what waited out a
    /// reject's backoff, and returns parked slots whose quarantine is over:
    /// each in deadline order, taken from the heaps, so a call costs what
    /// is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, i)) = self.transfers.records.next_due() {
            if at > now {
                break;
            }
            let Some(t) = self.transfers.records.get(i) else {
                break;
            };
            if t.deadline <= now {
                let reason = match t.phase {
                    Phase::Queued { .. } => FailReason::QueueTimeout,
                    Phase::Allocating => FailReason::AllocTimeout,
                    Phase::Pushing => FailReason::PushTimeout,
                    Phase::Ready => FailReason::DoneTimeout,
                };
                self.fail(now, i, reason);
                continue;
            }
            // Not failed, yet due: a backoff ended.
            let Phase::Queued { retry_at: Some(_) } = t.phase else {
                break;
            };
            if let Some(mut t) = self.transfers.records.get_mut(i) {
                t.phase = Phase::Queued { retry_at: None };
            }
            self.enqueue(i);
        }
        while let Some((at, p)) = self.remains.parked.next_due() {
            if at > now {
                break;
            }
            let Some(p) = self.remains.parked.remove(p) else {
                break;
            };
            self.give_back(p.member, p.slot_id);
        }
        self.dispatch_queued(now);
    }
}
