//! Where the instance stands with its coordinator: registering again,
//! losing the coordinator, and what the application asks of it.

use super::*;

/// Where the instance stands with its coordinator, from its registration
/// to its leaving.
#[derive(Debug)]
pub(super) struct Standing {
    pub(super) registered: bool,
    /// It takes no new work ([`Instance::drain`]).
    pub(super) draining: bool,
    /// ferry's coordinator said nothing is addressed to it any more.
    pub(super) drain_acked: bool,
    /// It leaves ([`Instance::leave`]), for this reason: it waits for the
    /// completions of the writes it posted, then says it is gone.
    pub(super) leaving: Option<Reason>,
    /// It left: terminal; nothing more is sent.
    pub(super) left: bool,
    /// A registration went out (answered or not).
    pub(super) register_sent: bool,
    /// Registrations sent to this coordinator and not answered yet: an
    /// ack beyond the first answers one this instance resent, and is
    /// expected, not a duplicate to count.
    pub(super) acks_owed: u32,
    /// Left while a registration went out unanswered: the coordinator
    /// may have taken it, so it hears of the leaving too.
    pub(super) farewell: Option<Reason>,
    /// The last answer to the registration was a refusal.
    pub(super) refused: bool,
    /// Its reason, as the coordinator gave it (empty if it gave none).
    pub(super) refusal: Reason,
    /// A registration is to be sent (before anything else).
    pub(super) register_due: bool,
    pub(super) register_at: Instant,
    /// Which conversation with a coordinator this is: it moves on each
    /// time the instance registers anew ([`Instance::conversation`]).
    pub(super) conversation: u64,
}

impl Standing {
    /// Not registered yet: the registration is due at once, and again at
    /// `retry` until it is answered.
    pub(super) fn new(retry: Instant) -> Self {
        Self {
            registered: false,
            draining: false,
            drain_acked: false,
            leaving: None,
            left: false,
            register_sent: false,
            acks_owed: 0,
            farewell: None,
            refused: false,
            refusal: Reason::EMPTY,
            register_due: true,
            register_at: retry,
            conversation: 0,
        }
    }
}

impl Instance<'_> {
    /// Registers again (the coordinator restarted, or the control channel
    /// reconnected): nothing else is sent until it is acknowledged.
    ///
    /// What the lost coordinator was relaying ends here: a new one knows
    /// nothing of it. Staged requests fail (their slots are freed), writes
    /// in progress will not be reported, reserved slots are quarantined (a
    /// write may still land), transfers the application holds are marked
    /// aborted, and messages still queued for the old coordinator are
    /// dropped. Requests being filled are kept. The registration goes out
    /// once the application has released every preallocated slot it holds.
    pub fn reregister(&mut self, now: Instant) {
        if self.standing.leaving.is_some() {
            // Gone for good: nothing is announced again.
            return;
        }
        self.standing.registered = false;
        self.standing.refused = false;
        // A new conversation: answers the old one still owed are not
        // expected any more.
        self.standing.acks_owed = 0;
        self.standing.conversation = self.standing.conversation.wrapping_add(1);
        for u in self.slots.uses.iter_mut() {
            if let Use::Refused { report, .. } = &mut u.0 {
                *report = None;
            }
        }
        self.standing.register_due = true;
        self.standing.register_at = now + self.config.register_retry;
        self.outbox.forget_transmits();
        for index in 0..self.transfers.requests.capacity() {
            let Some(r) = self.transfers.requests.remove(index) else {
                continue;
            };
            let token = Token { index, seq: r.seq };
            let kind = match r.kind {
                k @ (Kind::Staged { .. } | Kind::Writing { .. }) => {
                    let lost = Reason::truncated("the coordinator was lost");
                    match self.abandon_send(r.id, k, lost) {
                        Some(k) => k,
                        None => continue,
                    }
                }
                // A write may still land in these; the old coordinator
                // wants no report.
                Kind::Reserved { slot } => {
                    self.transfers.tombstone(r.id, Side::Recv);
                    self.sit_out(index, (r.id, r.seq), Held::Pool(slot), now, None);
                    continue;
                }
                Kind::Landing { held, .. } => {
                    self.transfers.tombstone(r.id, Side::Recv);
                    self.sit_out(index, (r.id, r.seq), held, now, None);
                    continue;
                }
                // Nothing was reserved; the old coordinator's request ends.
                Kind::AllocHeld { .. } => {
                    self.transfers.tombstone(r.id, Side::Recv);
                    continue;
                }
                // A new coordinator wants no report of what the old one
                // relayed.
                Kind::Quarantined { held, .. } => Kind::Quarantined { held, report: None },
                Kind::Delivered { held, aborted } => {
                    if !aborted {
                        self.event(InstanceEvent::Aborted(token));
                    }
                    Kind::Delivered {
                        held,
                        aborted: true,
                    }
                }
                other => other,
            };
            self.transfers.requests.put(index, Request { kind, ..r });
        }
    }

    /// The send side of a request no coordinator will relay any more (it
    /// was lost, or this instance leaves), for `why`: a staged slot is
    /// freed and the request ends (`None`); a write still posted is marked
    /// aborted and kept until its completion, which then frees the slot
    /// and reports nothing. The application hears of the failure once.
    /// Other kinds come back as they are.
    pub(super) fn abandon_send(
        &mut self,
        id: RequestId,
        mut kind: Kind,
        why: Reason,
    ) -> Option<Kind> {
        if let Kind::Writing { aborted, .. } = &mut kind {
            if !core::mem::replace(aborted, true) {
                self.event(InstanceEvent::SendFailed { id, reason: why });
            }
            return Some(kind);
        }
        match kind {
            Kind::Staged { slot, .. } => {
                let _ = self.slots.pool.free(slot);
                self.transfers.tombstone(id, Side::Send);
                self.event(InstanceEvent::SendFailed { id, reason: why });
                None
            }
            other => Some(other),
        }
    }

    /// True once the coordinator acknowledged the registration.
    pub fn is_registered(&self) -> bool {
        self.standing.registered
    }

    /// Why the coordinator refused the registration, as it said (empty if
    /// it said nothing, or did not refuse).
    pub fn refusal(&self) -> &str {
        self.standing.refusal.as_str()
    }

    /// Which conversation with a coordinator the messages polled now
    /// belong to. It moves on when the instance registers anew
    /// ([`reregister`](Self::reregister), which a lost coordinator
    /// causes): the machine then drops what it still queued for the old
    /// coordinator, and a caller that keeps polled messages to send later
    /// drops those polled under an earlier conversation too, since a new
    /// coordinator must hear nothing before the registration.
    pub fn conversation(&self) -> u64 {
        self.standing.conversation
    }

    /// Where the registration stands.
    pub fn registration(&self) -> Registration {
        if self.standing.registered && self.config.head == Head::Sglang {
            Registration::Sent
        } else if self.standing.registered {
            Registration::Accepted
        } else if self.standing.refused {
            Registration::Refused
        } else {
            Registration::Pending
        }
    }

    /// The control channel says the coordinator is gone (its connection
    /// closed, or a send to it found no peer). An instance whose
    /// registration was answered registers anew ([`reregister`]); one
    /// still registering goes on as it was, since the lost coordinator
    /// knew nothing of it.
    ///
    /// [`reregister`]: Self::reregister
    pub fn handle_coordinator_lost(&mut self, now: Instant) {
        if self.standing.registered || self.standing.refused {
            self.reregister(now);
        }
    }
}
