//! The member registry: registration and its answer, a member dropped or
//! lost, and who sent a message.

use super::*;

impl<'s, const P: usize> Coordinator<'s, P> {
    pub(super) fn on_register(
        &mut self,
        now: Instant,
        from: PeerId,
        m: &Register<'_>,
    ) -> Result<(), Ignored> {
        let session = Name::from_json(m.session_id).map_err(|_| Ignored::TooLong("session_id"))?;
        let endpoint =
            Name::from_json(m.work_endpoint).map_err(|_| Ignored::TooLong("work_endpoint"))?;
        let role = self.pipeline().iter().position(|r| r.eq_json(m.role));
        if !self.admits(role, &endpoint) {
            // Not answered: the answer would go to an endpoint nobody
            // vouched for.
            self.stats.refused += 1;
            self.event(CoordinatorEvent::Refused {
                peer: from,
                reason: "the endpoint is not admitted for this role",
                acked: false,
            });
            return Err(Ignored::NotAdmitted);
        }
        let refuse = |c: &mut Self, error: &'static str| {
            c.send(
                from,
                OutMsg::Ack {
                    session,
                    role: usize::MAX,
                    accepted: false,
                    error: Some(error),
                },
            );
            c.stats.refused += 1;
            c.event(CoordinatorEvent::Refused {
                peer: from,
                reason: error,
                acked: true,
            });
            Ok(())
        };
        let Some(role) = role else {
            return refuse(self, "unknown role");
        };
        if m.pool_ptr.checked_add(m.pool_size).is_none() {
            return refuse(self, "pool_ptr + pool_size overflows 64 bits");
        }
        let prealloc = match PreallocTable::<P>::from_registration(
            &m.preallocated_slots,
            m.pool_ptr,
            m.pool_size,
        ) {
            Ok(t) => t,
            Err(_) => return refuse(self, "bad preallocated_slots"),
        };
        // The same endpoint (or peer) registering again.
        let existing = self.members.iter().position(|x| {
            x.as_ref()
                .is_some_and(|x| x.endpoint == endpoint || x.peer == from)
        });
        if let Some(i) = existing {
            let same = self.members[i]
                .as_ref()
                .is_some_and(|x| x.session == session && x.peer == from);
            if same {
                // A retried registration: answer again, change nothing.
                self.accept(from, session, role);
                return Err(Ignored::Duplicate);
            }
        }
        let index = match existing.or_else(|| self.members.iter().position(Option::is_none)) {
            Some(i) => i,
            None => return refuse(self, "coordinator instance table full"),
        };
        // Epochs are never reused, so no reference to an earlier member of
        // this table slot can match the new one.
        self.epochs = self.epochs.wrapping_add(1);
        let epoch = self.epochs;
        let replaced = if let Some(old) = self.members[index].as_ref() {
            let old_ref = MemberRef {
                index,
                epoch: old.epoch,
            };
            self.drop_member(now, old_ref);
            true
        } else {
            false
        };
        self.members[index] = Some(Member {
            peer: from,
            role,
            session,
            endpoint,
            pool_ptr: m.pool_ptr,
            pool_size: m.pool_size,
            prealloc,
            capacity: Capacity::new(index as u32, self.config.capacity_per_instance),
            epoch,
        });
        self.accept(from, session, role);
        self.event(CoordinatorEvent::Registered {
            peer: from,
            role,
            replaced,
        });
        self.dispatch_queued(now);
        Ok(())
    }

    /// Acknowledges a registration.
    pub(super) fn accept(&mut self, to: PeerId, session: Name, role: usize) {
        let ack = OutMsg::Ack {
            session,
            role,
            accepted: true,
            error: None,
        };
        self.send(to, ack);
    }

    /// Fails every transfer involving `r`, forgets its parked slots, and
    /// removes it.
    pub(super) fn drop_member(&mut self, now: Instant, r: MemberRef) {
        for i in 0..self.transfers.len() {
            let involved = self.transfers[i]
                .as_ref()
                .is_some_and(|t| t.sender == r || t.receiver == Some(r));
            if involved {
                self.fail(now, i, FailReason::PeerGone);
            }
        }
        for p in self.parked.iter_mut() {
            if p.is_some_and(|p| p.member == r) {
                *p = None;
            }
        }
        if let Some(slot) = self.members.get_mut(r.index) {
            *slot = None;
        }
    }

    /// The role (index into the pipeline) of registered peer `peer`.
    pub fn role_of(&self, peer: PeerId) -> Option<usize> {
        self.members
            .iter()
            .flatten()
            .find(|m| m.peer == peer)
            .map(|m| m.role)
    }

    /// Who sent `msg`, judged by its content, for control channels that
    /// cannot name the sender (a ZeroMQ PULL socket cannot). `role` is the
    /// sender's role if the channel knows it (sglang gives each role its
    /// own result endpoint); without it, a `transfer_done` for a request
    /// that two legs hold at once cannot be told apart.
    ///
    /// `transfer_staged`, `transfer_allocated` and `transfer_alloc_reject`
    /// name their session; `transfer_pushed` comes from the sender of the
    /// leg being written, `transfer_done` from the receiver of the leg
    /// delivered (or of a failed one whose slot waits for it).
    /// `transfer_register` has no sender yet: `None`.
    pub fn sender_of(&self, msg: &Msg<'_>, role: Option<usize>) -> Option<PeerId> {
        let by_session = |session: JsonStr<'_>| {
            self.members
                .iter()
                .flatten()
                .find(|m| m.session.eq_json(session) && role.is_none_or(|r| r == m.role))
                .map(|m| m.peer)
        };
        let leg = |id: JsonStr<'_>, phase: Phase, receiver: bool| {
            self.transfers.iter().flatten().find_map(|t| {
                if !t.id.eq_json(id) || t.phase != phase {
                    return None;
                }
                let (who, who_role) = if receiver {
                    (t.receiver?, t.sender_role + 1)
                } else {
                    (t.sender, t.sender_role)
                };
                if role.is_some_and(|r| r != who_role) {
                    return None;
                }
                self.member(who).map(|m| m.peer)
            })
        };
        match msg {
            Msg::Staged(m) => by_session(m.session_id),
            Msg::Allocated(m) => by_session(m.session_id),
            Msg::AllocReject(m) => by_session(m.session_id),
            Msg::Pushed(m) => leg(m.request_id, Phase::Pushing, false),
            Msg::Done(m) => leg(m.request_id, Phase::Ready, true).or_else(|| {
                self.parked.iter().flatten().find_map(|p| {
                    let m2 = self.member(p.member)?;
                    (p.held && p.id.eq_json(m.request_id) && role.is_none_or(|r| r == m2.role))
                        .then_some(m2.peer)
                })
            }),
            _ => None,
        }
    }

    /// The caller's transport lost `peer` for good: its instance is dropped
    /// and its transfers fail.
    pub fn peer_lost(&mut self, now: Instant, peer: PeerId) {
        if let Some(index) = self.member_of_peer(peer) {
            if let Some(epoch) = self.members[index].as_ref().map(|m| m.epoch) {
                self.drop_member(now, MemberRef { index, epoch });
            }
        }
    }
}
