//! The receivers' and senders' replies: allocated, rejected, pushed, done.

use super::*;

impl<'s> Coordinator<'s> {
    pub(super) fn on_allocated(&mut self, at: Arrived, m: &Allocated<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let i = self.expect(m.request_id, from, false, |p| *p == Phase::Allocating)?;
        let t = self
            .transfers
            .records
            .get(i)
            .ok_or(Ignored::UnknownRequest)?;
        let (receiver, data_size, id, sender) = (t.receiver, t.data_size, t.id, t.sender);
        let r = receiver
            .and_then(|r| self.member(r))
            .ok_or(Ignored::WrongPeer)?;
        if !r.session.eq_json(m.session_id) {
            return Err(Ignored::WrongPeer);
        }
        let end = m.slot_offset.checked_add(m.slot_size);
        let dest_addr = r.pool_ptr.checked_add(m.slot_offset);
        let (session, fits) = (
            r.session,
            m.slot_size >= data_size && end.is_some_and(|e| e <= r.pool_size),
        );
        let (Some(dest_addr), true) = (dest_addr, fits) else {
            self.fail(now, i, FailReason::BadSlot);
            return Ok(());
        };
        let Some(sender_peer) = self.member(sender).map(|s| s.peer) else {
            self.fail(now, i, FailReason::PeerGone);
            return Ok(());
        };
        if let Some(mut t) = self.transfers.records.get_mut(i) {
            t.slot_offset = m.slot_offset;
            t.phase = Phase::Pushing;
            t.deadline = now + self.config.timeouts.push;
            t.pushed_at = now;
        }
        self.send(
            sender_peer,
            OutMsg::Push {
                id,
                dest_session: session,
                dest_addr,
                transfer_size: data_size,
            },
        );
        Ok(())
    }

    pub(super) fn on_reject(&mut self, at: Arrived, m: &AllocReject<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let i = self.expect(m.request_id, from, false, |p| *p == Phase::Allocating)?;
        let attempts = self.transfers.records.get(i).map_or(0, |t| t.attempts);
        if !m.retryable || attempts >= self.config.max_attempts {
            self.fail(now, i, FailReason::Rejected);
            return Ok(());
        }
        self.release(i);
        let backoff = self.config.retry_backoff * attempts;
        if let Some(mut t) = self.transfers.records.get_mut(i) {
            // Out of the queue until the backoff ends (its deadline heap
            // entry brings it back).
            t.phase = Phase::Queued {
                retry_at: (!backoff.is_zero()).then(|| now + backoff),
            };
            t.deadline = t.queued_until.max(now + backoff);
        }
        if backoff.is_zero() {
            self.enqueue(i);
        }
        self.dispatch_queued(now);
        Ok(())
    }

    pub(super) fn on_pushed(&mut self, at: Arrived, m: &Pushed<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let i = self.expect(m.request_id, from, true, |p| *p == Phase::Pushing)?;
        if !m.success {
            self.fail(now, i, FailReason::WriteFailed);
            return Ok(());
        }
        let Some(receiver) = self.transfers.records.get(i).and_then(|t| t.receiver) else {
            return Err(Ignored::WrongState);
        };
        let Some(peer) = self.member(receiver).map(|r| r.peer) else {
            self.fail(now, i, FailReason::PeerGone);
            return Ok(());
        };
        let seq = match self.transfers.records.get_mut(i) {
            Some(mut t) => {
                t.phase = Phase::Ready;
                t.deadline = now + self.config.timeouts.done;
                t.ready_at = now;
                t.seq
            }
            None => return Err(Ignored::UnknownRequest),
        };
        self.send(peer, OutMsg::Ready { index: i, seq });
        Ok(())
    }

    pub(super) fn on_done(&mut self, at: Arrived, m: &Done<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let i = match self.expect(m.request_id, from, false, |p| *p == Phase::Ready) {
            Ok(i) => i,
            Err(Ignored::UnknownRequest) => return self.late_done(from, m.request_id),
            Err(e) => return Err(e),
        };
        let Some(t) = self.transfers.records.get(i) else {
            return Err(Ignored::UnknownRequest);
        };
        let (id, leg) = (t.id, t.sender_role);
        let timing = LegTiming {
            queued: t.pushed_at.since(t.staged_at),
            written: t.ready_at.since(t.pushed_at),
            consumed: now.since(t.ready_at),
        };
        if m.error.is_some() {
            self.end(now, i);
            self.stats.failed += 1;
            self.event(CoordinatorEvent::Failed {
                id,
                leg,
                reason: FailReason::ReceiverError,
            });
        } else {
            self.end(now, i);
            self.stats.delivered += 1;
            self.event(CoordinatorEvent::Delivered { id, leg, timing });
            if let Some(next) = m.staged() {
                // sglang's forward: the receiver staged the next leg in the
                // same message, as if it had sent `transfer_staged`. The
                // done stands whatever becomes of it; a staged leg this
                // coordinator cannot take counts as ignored.
                self.stats.forwarded += 1;
                if self.on_staged(at, &next).is_err() {
                    self.stats.ignored += 1;
                }
            }
        }
        self.dispatch_queued(now);
        Ok(())
    }

    /// A `transfer_done` for a request that already failed: the receiver
    /// has let go of its preallocated slot now.
    pub(super) fn late_done(&mut self, from: PeerId, id: JsonStr<'_>) -> Result<(), Ignored> {
        let found = self.id_hash(id).and_then(|hash| {
            self.remains.parked.find(hash, |p| {
                p.held && p.id.eq_json(id) && self.member(p.member).is_some_and(|m| m.peer == from)
            })
        });
        let Some(p) = found.and_then(|pi| self.remains.parked.remove(pi)) else {
            return Err(Ignored::UnknownRequest);
        };
        self.give_back(p.member, p.slot_id);
        Ok(())
    }
}
