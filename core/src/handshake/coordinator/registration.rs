//! Registration and its answer, a member dropped or lost, and who sent a
//! message: what the coordinator does with its registry (`registry.rs`).

use super::*;

impl<'s> Coordinator<'s> {
    /// Counts a registration from `from` refused for `reason`, and tells
    /// the application (`acked`: the instance was answered).
    fn refused(&mut self, from: PeerId, reason: &'static str, acked: bool) {
        self.stats.refused += 1;
        self.event(CoordinatorEvent::Refused {
            peer: from,
            reason,
            acked,
        });
    }

    pub(super) fn on_register(
        &mut self,
        at: Arrived,
        user: &str,
        m: &Register<'_>,
    ) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let user = Name::new(user).map_err(|_| Ignored::TooLong("user"))?;
        let session = Name::from_json(m.session_id).map_err(|_| Ignored::TooLong("session_id"))?;
        let endpoint =
            Name::from_json(m.work_endpoint).map_err(|_| Ignored::TooLong("work_endpoint"))?;
        let role = self.pipeline().iter().position(|r| r.eq_json(m.role));
        if !self.admits(role, &endpoint) {
            // Not answered: the answer would go to an endpoint nobody
            // vouched for.
            self.refused(from, "the endpoint is not admitted for this role", false);
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
            c.refused(from, error, true);
            Ok(())
        };
        let Some(role) = role else {
            return refuse(self, "unknown role");
        };
        if self.draining {
            return refuse(self, "coordinator shutting down");
        }
        if m.pool_ptr.checked_add(m.pool_size).is_none() {
            return refuse(self, "pool_ptr + pool_size overflows 64 bits");
        }
        let write_lifetime = Duration::from_millis(m.write_lifetime_ms);
        if write_lifetime > self.config.max_write_lifetime {
            return refuse(
                self,
                "write_lifetime_ms beyond the coordinator's max_write_lifetime",
            );
        }
        let prealloc = match PreallocTable::<MAX_PREALLOC_PER_MEMBER>::from_registration(
            &m.preallocated_slots,
            m.pool_ptr,
            m.pool_size,
        ) {
            Ok(t) if t.len() <= self.prealloc_per_member => t,
            Ok(_) => return refuse(self, "more preallocated_slots than the coordinator takes"),
            Err(_) => return refuse(self, "bad preallocated_slots"),
        };
        // The same endpoint (or peer) registering again.
        let endpoint_hash = self
            .registry
            .members
            .key()
            .bytes(endpoint.as_bytes(), NS_ENDPOINT);
        let session_hash = self
            .registry
            .members
            .key()
            .bytes(session.as_bytes(), NS_SESSION);
        let existing = self
            .registry
            .endpoints
            .find(endpoint_hash, |i| {
                self.registry
                    .members
                    .get(i)
                    .is_some_and(|x| x.endpoint == endpoint)
            })
            .or_else(|| self.member_of_peer(from));
        if let Some(i) = existing {
            // An endpoint registered under one key is not taken over under
            // another: the answer would go to the instance that holds it,
            // so none is sent. Once the first is gone (its connection
            // lost, or deregistered) the endpoint is free again.
            if self.registry.members.get(i).is_some_and(|x| x.user != user) {
                self.refused(from, "the endpoint is registered under another key", false);
                return Err(Ignored::WrongKey);
            }
            let same = self
                .registry
                .members
                .get(i)
                .is_some_and(|x| x.session == session && x.peer == from);
            if same {
                // A retried registration (its first answer was late): answer
                // again, change nothing. Handled, not ignored: the instance
                // expects the answer.
                self.accept(from, session, role);
                return Ok(());
            }
        }
        if existing.is_none() && self.registry.members.is_full() {
            return refuse(self, "coordinator instance table full");
        }
        // Epochs are never reused, so no reference to an earlier member of
        // this table slot can match the new one.
        self.epochs = self.epochs.wrapping_add(1);
        let epoch = self.epochs;
        let replaced = match existing.and_then(|i| Some((i, self.registry.members.get(i)?.epoch))) {
            Some((index, epoch)) => {
                self.drop_member(now, MemberRef { index, epoch }, FailReason::PeerGone);
                true
            }
            None => false,
        };
        // The place the member takes: the one just freed, if it replaced.
        let Some(index) = self.registry.members.next_free() else {
            return refuse(self, "coordinator instance table full");
        };
        let member = Member {
            peer: from,
            role,
            session,
            endpoint,
            user,
            pool_ptr: m.pool_ptr,
            pool_size: m.pool_size,
            prealloc,
            capacity: Capacity::new(index as u32, self.config.capacity_per_instance),
            epoch,
            last_pick: 0,
            counted_taken: 0,
            draining: false,
            drain_told: false,
            write_lifetime,
        };
        // Indexed three ways, or not at all.
        let indexed = match self.registry.members.insert(member) {
            Ok(i) if self.registry.sessions.insert(session_hash, i).is_err() => {
                self.registry.members.remove(i);
                None
            }
            Ok(i) if self.registry.endpoints.insert(endpoint_hash, i).is_err() => {
                self.registry.sessions.remove(session_hash, i);
                self.registry.members.remove(i);
                None
            }
            Ok(i) => Some(i),
            Err(_) => None,
        };
        let Some(index) = indexed else {
            return refuse(self, "coordinator instance table full");
        };
        self.rank(index);
        self.bound_slots(role);
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

    /// `transfer_deregister`: the member drains (taken out of the
    /// receivers' ranking, so it gets no ALLOC and no fast-path slot; what
    /// it holds goes on, and once nothing is addressed to it, it is told
    /// so), or is gone (dropped; what it was still needed for fails with
    /// [`FailReason::PeerLeft`]).
    pub(super) fn on_deregister(&mut self, at: Arrived, m: &Deregister<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let (r, member) = self.member_in_session(from, m.session_id)?;
        let (index, role, draining) = (r.index, member.role, member.draining);
        if m.draining {
            if draining {
                return Err(Ignored::Duplicate);
            }
            if let Some(mut member) = self.registry.members.get_mut(index) {
                member.draining = true;
            }
            // `rank` keeps a draining member out of both heaps, and tells
            // it when nothing is addressed to it.
            self.rank(index);
        } else {
            self.drop_member(now, r, FailReason::PeerLeft);
        }
        self.event(CoordinatorEvent::Deregistered {
            peer: from,
            role,
            draining: m.draining,
            reason: Reason::from_json_truncated(m.reason),
        });
        Ok(())
    }

    /// Fails every transfer that still needs `r` (with `reason`), forgets
    /// its parked slots, and removes it. A transfer `r` only sent, whose
    /// bytes are written (phase Ready), does not need it: the receiver
    /// holds them, and it goes on.
    ///
    /// The one operation that reads whole tables: it happens once per
    /// member lost, replaced or gone, not per message.
    pub(super) fn drop_member(&mut self, now: Instant, r: MemberRef, reason: FailReason) {
        if self.member(r).is_none() {
            return;
        }
        for i in 0..self.transfers.records.capacity() {
            let involved = self.transfers.records[i].as_ref().is_some_and(|t| {
                t.receiver == Some(r) || (t.sender == r && t.phase != Phase::Ready)
            });
            if involved {
                self.fail(now, i, reason);
            }
        }
        for p in 0..self.remains.parked.capacity() {
            if self.remains.parked[p]
                .as_ref()
                .is_some_and(|p| p.member == r)
            {
                self.remains.parked.remove(p);
            }
        }
        self.registry.ranking.remove(r.index);
        self.registry.room_ranking.remove(r.index);
        if let Some(m) = self.registry.members.remove(r.index) {
            self.bound_slots(m.role);
            self.registry.prealloc_taken =
                self.registry.prealloc_taken.saturating_sub(m.counted_taken);
            let key = self.registry.members.key();
            let session = key.bytes(m.session.as_bytes(), NS_SESSION);
            let endpoint = key.bytes(m.endpoint.as_bytes(), NS_ENDPOINT);
            self.registry.sessions.remove(session, r.index);
            self.registry.endpoints.remove(endpoint, r.index);
        }
    }

    /// The role (index into the pipeline) of registered peer `peer`.
    pub fn role_of(&self, peer: PeerId) -> Option<usize> {
        let i = self.member_of_peer(peer)?;
        self.registry.members.get(i).map(|m| m.role)
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
        self.sender_among(msg, role, "")
    }

    /// [`sender_of`](Self::sender_of) among the members registered as
    /// `user` (every member, where `user` is empty): a message the channel
    /// authenticated is never pinned on another key's instance.
    pub(super) fn sender_among(
        &self,
        msg: &Msg<'_>,
        role: Option<usize>,
        user: &str,
    ) -> Option<PeerId> {
        let as_user = |m: &Member| user.is_empty() || m.user.as_str() == user;
        let by_session = |session: JsonStr<'_>| {
            let hash = self
                .registry
                .members
                .key()
                .json::<{ crate::handshake::NAME_LEN }>(session, NS_SESSION)?;
            let i = self.registry.sessions.find(hash, |i| {
                self.registry.members.get(i).is_some_and(|m| {
                    m.session.eq_json(session) && role.is_none_or(|r| r == m.role) && as_user(m)
                })
            })?;
            self.registry.members.get(i).map(|m| m.peer)
        };
        let leg = |id: JsonStr<'_>, phase: Phase, receiver: bool| {
            let who = |t: &Transfer| {
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
                self.member(who).filter(|m| as_user(m)).map(|m| m.peer)
            };
            let i = self
                .transfers
                .records
                .find(self.id_hash(id)?, |t| who(t).is_some())?;
            self.transfers.records.get(i).and_then(who)
        };
        match msg {
            Msg::Staged(m) => by_session(m.session_id),
            Msg::Allocated(m) => by_session(m.session_id),
            Msg::AllocReject(m) => by_session(m.session_id),
            Msg::Deregister(m) => by_session(m.session_id),
            Msg::Pushed(m) => leg(m.request_id, Phase::Pushing, false),
            Msg::Done(m) => leg(m.request_id, Phase::Ready, true).or_else(|| {
                let held_by = |p: &Parked| {
                    let m2 = self.member(p.member)?;
                    (p.held
                        && p.id.eq_json(m.request_id)
                        && role.is_none_or(|r| r == m2.role)
                        && as_user(m2))
                    .then_some(m2.peer)
                };
                let p = self
                    .remains
                    .parked
                    .find(self.id_hash(m.request_id)?, |p| held_by(p).is_some())?;
                self.remains.parked.get(p).and_then(held_by)
            }),
            _ => None,
        }
    }

    /// The caller's transport lost `peer` for good: its instance is dropped
    /// and its transfers fail.
    pub fn peer_lost(&mut self, now: Instant, peer: PeerId) {
        if let Some(index) = self.member_of_peer(peer) {
            if let Some(epoch) = self.registry.members.get(index).map(|m| m.epoch) {
                self.drop_member(now, MemberRef { index, epoch }, FailReason::PeerGone);
            }
        }
    }
}
