//! Leaving: a drain (no new work, what is held goes on), then the end
//! (what is still held fails, and the coordinator and the peers are told).
//!
//! A service stopped by SIGTERM drains first, so that a stop loses as
//! little as it can, and leaves when the drain is over or its grace
//! period ends; the decisions of both steps are here, where the path
//! tests and the simulation see them, not in the runtime.

use super::*;

/// The reason an ALLOC that reaches a draining instance is refused with.
pub(super) const DRAINING: &str = "instance draining";

impl<'s> Instance<'s> {
    /// Takes no new work from now on; what the instance holds goes on to
    /// its end.
    ///
    /// [`stage`](Self::stage) is refused ([`InstanceError::Draining`])
    /// but for the next leg of a request the instance holds as receiver, a
    /// `transfer_alloc` is refused (`transfer_alloc_reject`, retryable, so
    /// the coordinator asks another receiver; under [`Head::Sglang`],
    /// which reads no reject, `transfer_done` with the error at once), and
    /// ferry's coordinator is told (`transfer_deregister{draining}`), so it
    /// stops choosing this instance as a receiver and using its
    /// preallocated slots. A forward finishes work in flight, so it goes
    /// on. Wait for [`is_drained`](Self::is_drained), then
    /// [`leave`](Self::leave).
    pub fn drain(&mut self, now: Instant) {
        self.last_now = now;
        if self.standing.draining {
            return;
        }
        self.standing.draining = true;
        if self.config.head == Head::Ferry && self.standing.registered {
            self.send(OutMsg::Deregister {
                draining: true,
                reason: Reason::truncated(DRAINING),
            });
        }
    }

    /// True once [`drain`](Self::drain) or [`leave`](Self::leave) was
    /// called.
    pub fn is_draining(&self) -> bool {
        self.standing.draining
    }

    /// True once [`leave`](Self::leave) was called (it may still wait for
    /// writes it posted: see [`has_left`](Self::has_left)).
    pub fn is_leaving(&self) -> bool {
        self.standing.leaving.is_some()
    }

    /// True once the instance left: [`leave`](Self::leave) was called and
    /// every write it had posted is in (each reported as usual), so it
    /// said it is gone. Nothing is sent after that.
    pub fn has_left(&self) -> bool {
        self.standing.left
    }

    /// Requests still in progress here: all those held but slots sitting
    /// out a quarantine, which need no one's answer.
    pub fn in_flight(&self) -> usize {
        self.transfers.requests.len() - self.transfers.requests.tally(CLASS_QUARANTINED)
    }

    /// True once a drain is over: nothing is in progress here, and ferry's
    /// coordinator said nothing more is addressed to this instance (it may
    /// have sent a fast-path transfer this instance does not know of yet,
    /// before it heard of the drain). Under [`Head::Sglang`], which says
    /// no such thing, or with no coordinator that knows this instance, the
    /// first alone.
    pub fn is_drained(&self) -> bool {
        let told = self.standing.drain_acked
            || self.config.head == Head::Sglang
            || !self.standing.registered;
        self.standing.draining && told && self.in_flight() == 0
    }

    /// Ends the instance's part in everything (the drain's end, or a stop
    /// without one), for `reason`: every request still held fails.
    ///
    /// Under ferry's coordinator one message says it all
    /// (`transfer_deregister`): the coordinator fails every transfer this
    /// instance takes part in and sends its peers `transfer_abort`. Under
    /// [`Head::Sglang`], which knows no deregistration, each receive the
    /// head waits on is failed with `transfer_done{error}`; a request this
    /// instance sends is failed at the head's timeout (that head has no
    /// way to be told). Messages queued before are sent first.
    ///
    /// Locally, staged and reserved slots are freed, the application hears
    /// [`InstanceEvent::SendFailed`] for each request it staged that was
    /// not written, and [`InstanceEvent::Aborted`] for each transfer it
    /// still holds (release it as usual).
    ///
    /// A write still posted is let finish: its bytes may be on their way,
    /// so it is reported as usual when its completion comes
    /// ([`handle_completion`]), and only then, once no write of this
    /// instance is out, does it say it is gone ([`has_left`]). Wait for
    /// that (the data plane completes or fails every write within its
    /// write timeout) before the pool goes. Nothing is registered again,
    /// and after that nothing is sent and messages are ignored.
    ///
    /// [`handle_completion`]: Self::handle_completion
    /// [`has_left`]: Self::has_left
    pub fn leave(&mut self, now: Instant, reason: &str) {
        self.last_now = now;
        if self.standing.leaving.is_some() {
            return;
        }
        let why = Reason::truncated(reason);
        self.standing.draining = true;
        self.standing.leaving = Some(why);
        self.standing.register_due = false;
        let sglang = self.config.head == Head::Sglang;
        // Preallocated slots held for a refusal: their report is due now
        // (sglang's head reads it; ferry's learns all from the leaving).
        for p in 0..self.slots.uses.len() {
            if let Some(Use::Refused { id, report, .. }) = self.slots.uses.get(p).map(|u| u.0) {
                self.slots.set_use(p, PreallocUse::FREE);
                if sglang && report.is_some() {
                    self.send(OutMsg::Done {
                        id,
                        error: Some(why),
                    });
                }
            }
        }
        for index in 0..self.transfers.requests.capacity() {
            let Some(r) = self.transfers.requests.remove(index) else {
                continue;
            };
            let token = Token { index, seq: r.seq };
            let kind = match r.kind {
                Kind::Filling { slot } => {
                    // The application's; `unstage` or `commit` of it will be
                    // refused as stale.
                    let _ = self.slots.pool.free(slot);
                    continue;
                }
                k @ Kind::Staged { .. } => match self.abandon_send(r.id, k, why) {
                    Some(k) => k,
                    None => continue,
                },
                // Reported when its completion comes.
                k @ Kind::Writing { .. } => k,
                Kind::Reserved { slot } => {
                    let _ = self.slots.pool.free(slot);
                    self.left_receive(r.id, sglang, why);
                    continue;
                }
                Kind::AllocHeld { .. } => {
                    self.left_receive(r.id, sglang, why);
                    continue;
                }
                Kind::Landing { held, .. } => {
                    self.slots.free_held(held);
                    self.left_receive(r.id, sglang, why);
                    continue;
                }
                Kind::Quarantined { held, report } => {
                    self.slots.free_held(held);
                    if sglang && report.is_some() {
                        self.send(OutMsg::Done {
                            id: r.id,
                            error: Some(why),
                        });
                    }
                    continue;
                }
                Kind::Delivered { held, aborted } => {
                    if !aborted {
                        self.event(InstanceEvent::Aborted(token));
                        if sglang {
                            self.send(OutMsg::Done {
                                id: r.id,
                                error: Some(why),
                            });
                        }
                    }
                    Kind::Delivered {
                        held,
                        aborted: true,
                    }
                }
            };
            self.transfers.requests.put(index, Request { kind, ..r });
        }
        self.finish_leaving();
    }

    /// Once [`leave`](Self::leave) was called and no write is out: says
    /// the instance is gone (to ferry's coordinator, which fails what
    /// still needed it), and sends nothing more.
    pub(super) fn finish_leaving(&mut self) {
        let Some(why) = self.standing.leaving else {
            return;
        };
        if self.standing.left || self.transfers.requests.tally(CLASS_WRITING) > 0 {
            return;
        }
        if self.config.head == Head::Ferry {
            if self.standing.registered {
                self.send(OutMsg::Deregister {
                    draining: false,
                    reason: why,
                });
            } else if self.standing.register_sent {
                self.standing.farewell = Some(why);
            }
        }
        self.standing.left = true;
    }

    /// A receive ended by [`leave`](Self::leave): tombstoned, and failed
    /// at sglang's head (ferry's learns it from the deregistration).
    fn left_receive(&mut self, id: RequestId, sglang: bool, why: Reason) {
        self.transfers.tombstone(id, Side::Recv);
        if sglang {
            self.send(OutMsg::Done {
                id,
                error: Some(why),
            });
        }
    }
}
