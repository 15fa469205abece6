//! Staging and dispatch: a staged request, the choice of its receiver, the
//! wait queue.

use super::*;

impl<'s, const P: usize> Coordinator<'s, P> {
    pub(super) fn on_staged(
        &mut self,
        now: Instant,
        from: PeerId,
        m: &Staged<'_>,
    ) -> Result<(), Ignored> {
        let id = RequestId::from_json(m.request_id).map_err(|_| Ignored::TooLong("request_id"))?;
        let sender_index = self.member_of_peer(from).ok_or(Ignored::NotRegistered)?;
        let sender = self.members[sender_index]
            .as_ref()
            .ok_or(Ignored::NotRegistered)?;
        if !sender.session.eq_json(m.session_id) {
            return Err(Ignored::WrongPeer);
        }
        let sender_ref = MemberRef {
            index: sender_index,
            epoch: sender.epoch,
        };
        let sender_role = sender.role;
        let leg = Leg::FromRole(sender_role);
        let live = self
            .transfers
            .iter()
            .flatten()
            .find(|t| t.id.eq_json(m.request_id) && t.sender_role == sender_role)
            .map(|t| t.sender);
        // The same sender's staged again (a retry, a duplicate on the
        // network): ignored. Another sender's (an instance restarted under
        // the same name, two with the same ids): the id is taken, and the
        // sender is told so rather than left waiting.
        let duplicate = live == Some(sender_ref)
            || (live.is_none() && self.finished.buried_by(m.request_id, leg, sender_ref.epoch));
        let reused = live.is_some() || self.finished.contains(m.request_id, leg);
        if duplicate {
            return Err(Ignored::Duplicate);
        }
        if reused {
            self.send(
                from,
                OutMsg::Abort {
                    id,
                    reason: FailReason::IdReused.as_str(),
                    source_role: sender_role,
                },
            );
            self.stats.failed += 1;
            self.event(CoordinatorEvent::Failed {
                id,
                leg: sender_role,
                reason: FailReason::IdReused,
            });
            return Ok(());
        }
        self.stats.staged += 1;
        let abort = |c: &mut Self, reason: FailReason| {
            c.finished.bury_owned(id, leg, sender_ref.epoch);
            c.send(
                from,
                OutMsg::Abort {
                    id,
                    reason: reason.as_str(),
                    source_role: sender_role,
                },
            );
            c.stats.failed += 1;
            c.event(CoordinatorEvent::Failed {
                id,
                leg: sender_role,
                reason,
            });
            Ok(())
        };
        if sender_role + 1 >= self.role_count {
            return abort(self, FailReason::NoNextRole);
        }
        let Some(index) = self.transfers.iter().position(Option::is_none) else {
            return abort(self, FailReason::TableFull);
        };
        let manifest = match m.manifest {
            Manifest::Raw(raw) => raw.as_str(),
            // Decoded messages always carry raw manifests.
            Manifest::Entries(_) => return Err(Ignored::BadField("manifest")),
        };
        let scalars = m.scalar_fields.as_str();
        let base = index * self.chunk;
        let total = manifest.len() + scalars.len();
        let Some(dst) = self
            .nested
            .get_mut(base..base + total)
            .filter(|_| total <= self.chunk)
        else {
            return abort(self, FailReason::TooLarge);
        };
        dst[..manifest.len()].copy_from_slice(manifest.as_bytes());
        dst[manifest.len()..].copy_from_slice(scalars.as_bytes());
        self.seq += 1;
        self.transfers[index] = Some(Transfer {
            id,
            seq: self.seq,
            phase: Phase::Queued { retry_at: None },
            deadline: now + self.config.timeouts.queued,
            queued_until: now + self.config.timeouts.queued,
            sender: sender_ref,
            sender_role,
            receiver: None,
            ticket: None,
            prealloc: None,
            data_size: m.data_size,
            slot_offset: 0,
            attempts: 0,
            manifest_len: manifest.len(),
            scalars_len: scalars.len(),
            queue_ticket: 0,
            staged_at: now,
            pushed_at: now,
            ready_at: now,
        });
        self.enqueue(index);
        self.dispatch(now, index);
        Ok(())
    }

    /// Picks a receiver of the next role with capacity, by policy.
    pub(super) fn choose(&mut self, role: usize, data_size: u64) -> Option<usize> {
        let n = self.members.len();
        fn candidate<const P: usize>(m: &Option<Member<P>>, role: usize) -> Option<&Member<P>> {
            m.as_ref()
                .filter(|m| m.role == role && m.capacity.available() > 0)
        }
        match self.config.policy {
            Policy::RoundRobin => {
                let start = self.cursor[role] % n.max(1);
                let i = (0..n)
                    .map(|k| (start + k) % n)
                    .find(|&i| candidate(&self.members[i], role).is_some())?;
                self.cursor[role] = i + 1;
                Some(i)
            }
            Policy::MostFreeSlots => (0..n)
                .filter_map(|i| candidate(&self.members[i], role).map(|m| (i, m)))
                .max_by_key(|(i, m)| {
                    (
                        m.prealloc.free_fitting(data_size),
                        m.capacity.available(),
                        usize::MAX - i,
                    )
                })
                .map(|(i, _)| i),
        }
    }

    /// Tries to hand transfer `index` (queued) to a receiver.
    pub(super) fn dispatch(&mut self, now: Instant, index: usize) {
        let Some(t) = self.transfers[index].as_ref() else {
            return;
        };
        let Phase::Queued { retry_at } = t.phase else {
            return;
        };
        if retry_at.is_some_and(|at| at > now) {
            return;
        }
        let (data_size, id, sender) = (t.data_size, t.id, t.sender);
        let Some(role) = self.member(sender).map(|s| s.role + 1) else {
            self.fail(now, index, FailReason::PeerGone);
            return;
        };
        let Some(r) = self.choose(role, data_size) else {
            // No room anywhere: wait for a capacity release.
            if let Some(t) = self.transfers[index].as_mut() {
                t.phase = Phase::Queued { retry_at: None };
            }
            return;
        };
        let Some(m) = self.members[r].as_mut() else {
            return;
        };
        let Ok(ticket) = m.capacity.acquire() else {
            return;
        };
        let receiver = MemberRef {
            index: r,
            epoch: m.epoch,
        };
        let (peer, session) = (m.peer, m.session);
        let fast = m.prealloc.take(data_size);
        let Some(t) = self.transfers[index].as_mut() else {
            return;
        };
        t.receiver = Some(receiver);
        t.ticket = Some(ticket);
        t.attempts += 1;
        match fast {
            Some(slot) => {
                t.prealloc = Some(slot.slot_id);
                t.slot_offset = slot.offset;
                t.phase = Phase::Pushing;
                t.deadline = now + self.config.timeouts.push;
                t.pushed_at = now;
                self.stats.fast_path += 1;
                if let Some(sender_peer) = self.member(sender).map(|s| s.peer) {
                    self.send(
                        sender_peer,
                        OutMsg::Push {
                            id,
                            dest_session: session,
                            dest_addr: slot.addr,
                            transfer_size: data_size,
                        },
                    );
                }
            }
            None => {
                t.phase = Phase::Allocating;
                t.deadline = now + self.config.timeouts.alloc;
                let source_role = role - 1;
                self.send(
                    peer,
                    OutMsg::Alloc {
                        id,
                        data_size,
                        source_role,
                        session,
                    },
                );
            }
        }
    }

    /// Dispatches queued transfers, oldest first, as far as capacity goes.
    /// Puts transfer `index` at the back of the wait queue; any earlier
    /// entry of it goes stale.
    pub(super) fn enqueue(&mut self, index: usize) {
        self.queue_tickets += 1;
        let ticket = self.queue_tickets;
        if let Some(t) = self.transfers[index].as_mut() {
            t.queue_ticket = ticket;
        }
        let entry = Queued { index, ticket };
        if self.queue.push(entry).is_err() {
            // Full of stale entries (live ones are at most half): compact.
            for _ in 0..self.queue.len() {
                if let Some(e) = self.queue.pop() {
                    if self.is_live(e) {
                        let _ = self.queue.push(e);
                    }
                }
            }
            let _ = self.queue.push(entry);
        }
    }

    pub(super) fn is_live(&self, e: Queued) -> bool {
        self.transfers[e.index]
            .as_ref()
            .is_some_and(|t| t.queue_ticket == e.ticket && matches!(t.phase, Phase::Queued { .. }))
    }

    /// Dispatches queued transfers in queue order, as far as capacity
    /// goes: one pass over the queue. Once a role has no receiver with room
    /// its other requests are not tried; they wait for a capacity release.
    pub(super) fn dispatch_queued(&mut self, now: Instant) {
        let mut blocked = [false; 8];
        for _ in 0..self.queue.len() {
            let Some(e) = self.queue.pop() else { return };
            if !self.is_live(e) {
                continue;
            }
            let (retry_at, sender) = match self.transfers[e.index].as_ref() {
                Some(Transfer {
                    phase: Phase::Queued { retry_at },
                    sender,
                    ..
                }) => (*retry_at, *sender),
                _ => continue,
            };
            let role = self.member(sender).map_or(0, |m| m.role + 1);
            let is_blocked = blocked.get(role).copied().unwrap_or(true);
            if !is_blocked && retry_at.is_none_or(|at| at <= now) {
                self.dispatch(now, e.index);
            } else if is_blocked {
                // Waits for a capacity release, like the one that failed.
                if let Some(t) = self.transfers[e.index].as_mut() {
                    t.phase = Phase::Queued {
                        retry_at: retry_at.filter(|at| *at > now),
                    };
                }
            }
            if self.is_live(e) {
                if matches!(
                    self.transfers[e.index].as_ref().map(|t| t.phase),
                    Some(Phase::Queued { retry_at: None })
                ) {
                    if let Some(b) = blocked.get_mut(role) {
                        *b = true;
                    }
                }
                let _ = self.queue.push(e);
            }
        }
    }
}
