//! Time: when to be called back, and what each deadline ends.

use super::*;

impl<'s> Instance<'s> {
    /// When [`handle_timeout`](Self::handle_timeout) must be called next:
    /// the tops of the deadline heaps, or the registration's retry.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.standing.left {
            // Nothing is due once it left: no registration, no report.
            return None;
        }
        let register = (!self.standing.registered).then_some(self.standing.register_at);
        let refused = self.slots.timers.peek(0).map(|(at, _)| Instant(at));
        let requests = self.transfers.requests.next_due().map(|(at, _)| at);
        requests.into_iter().chain(register).chain(refused).min()
    }

    /// Retries registration, drops requests the coordinator went quiet
    /// about, and ends quarantines: each in deadline order, taken from the
    /// heaps, so a call costs what is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        if self.standing.left {
            return;
        }
        if !self.standing.registered
            && self.standing.register_at <= now
            && self.standing.leaving.is_none()
        {
            self.standing.register_at = now + self.config.register_retry;
            self.standing.register_due = true;
        }
        while let Some((at, p)) = self.slots.timers.peek(0) {
            if at > now.as_nanos() {
                break;
            }
            let Some(Use::Refused { id, report, .. }) = self.slots.uses.get(p).map(|u| u.0) else {
                self.slots.timers.remove(p);
                continue;
            };
            self.slots.set_use(p, PreallocUse::FREE);
            if let Some(why) = report {
                self.send(OutMsg::Done {
                    id,
                    error: Some(Reason::truncated(why)),
                });
            }
        }
        while let Some((at, i)) = self.transfers.requests.next_due() {
            if at > now {
                break;
            }
            let Some(r) = self.transfers.requests.remove(i) else {
                break;
            };
            match r.kind {
                Kind::AllocHeld { .. } => {
                    // No room came in time: the head hears it failed.
                    self.stats.timed_out += 1;
                    self.stats.rejected += 1;
                    self.done(r.id, Some(Reason::truncated("no room in the pool in time")));
                }
                Kind::Staged { slot, .. } => {
                    let _ = self.slots.pool.free(slot);
                    self.stats.timed_out += 1;
                    self.transfers.tombstone(r.id, Side::Send);
                    self.event(InstanceEvent::SendFailed {
                        id: r.id,
                        reason: Reason::truncated("no transfer_push in time (staged timeout)"),
                    });
                }
                Kind::Reserved { slot } => {
                    // Never told the outcome: a write may still come.
                    self.stats.timed_out += 1;
                    self.transfers.tombstone(r.id, Side::Recv);
                    self.sit_out(i, (r.id, r.seq), Held::Pool(slot), now, None);
                }
                Kind::Landing { held, .. } => {
                    // Announced ready, but the bytes did not arrive in time:
                    // they may still, so the slot sits out a quarantine,
                    // after which the coordinator hears of the failure.
                    self.stats.never_landed += 1;
                    self.transfers.tombstone(r.id, Side::Recv);
                    self.sit_out(i, (r.id, r.seq), held, now, Some(NEVER_LANDED));
                }
                Kind::Quarantined { held, report } => {
                    self.slots.free_held(held);
                    if let Some(why) = report {
                        self.send(OutMsg::Done {
                            id: r.id,
                            error: Some(Reason::truncated(why)),
                        });
                    }
                }
                other => {
                    // No deadline is set in other states; keep the record.
                    self.transfers.requests.put(
                        i,
                        Request {
                            kind: other,
                            deadline: None,
                            ..r
                        },
                    );
                }
            }
        }
        self.retry_held(now);
    }
}
