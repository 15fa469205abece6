//! Staging and dispatch: a staged request, the choice of its receiver, and
//! the receivers' ranking.

use super::*;

impl<'s> Coordinator<'s> {
    pub(super) fn on_staged(&mut self, at: Arrived, m: &Staged<'_>) -> Result<(), Ignored> {
        let Arrived { now, from } = at;
        let id = RequestId::from_json(m.request_id).map_err(|_| Ignored::TooLong("request_id"))?;
        let (sender_ref, sender) = self.member_in_session(from, m.session_id)?;
        let sender_role = sender.role;
        let leg = Leg::FromRole(sender_role);
        let hash = self.id_hash(m.request_id);
        let live = hash
            .and_then(|h| {
                self.transfers.records.find(h, |t| {
                    t.id.eq_json(m.request_id) && t.sender_role == sender_role
                })
            })
            .and_then(|i| self.transfers.records.get(i))
            .map(|t| t.sender);
        // The same sender's staged again (a retry, a duplicate on the
        // network): ignored. Another sender's (an instance restarted under
        // the same name, two with the same ids): the id is taken, and the
        // sender is told so rather than left waiting.
        let (buried, buried_by_sender) = match live {
            Some(_) => (false, false),
            None => self
                .remains
                .finished
                .lookup(m.request_id, leg, sender_ref.epoch),
        };
        let duplicate = live == Some(sender_ref) || buried_by_sender;
        let reused = live.is_some() || buried;
        if duplicate {
            return Err(Ignored::Duplicate);
        }
        let refused = if reused {
            Some(FailReason::IdReused)
        } else if self.draining && !self.carries(m.request_id, sender_role) {
            Some(FailReason::ShuttingDown)
        } else {
            None
        };
        if let Some(reason) = refused {
            self.refuse_staged(from, id, sender_role, reason);
            return Ok(());
        }
        self.stats.staged += 1;
        let abort = |c: &mut Self, reason: FailReason| {
            c.remains.finished.bury_owned(id, leg, sender_ref.epoch);
            c.refuse_staged(from, id, sender_role, reason);
            Ok(())
        };
        if sender_role + 1 >= self.role_count {
            return abort(self, FailReason::NoNextRole);
        }
        let Some(index) = self.transfers.records.next_free() else {
            return abort(self, FailReason::TableFull);
        };
        let manifest = match m.manifest {
            Manifest::Raw(raw) => raw.as_str(),
            // Decoded messages always carry raw manifests.
            Manifest::Entries(_) => return Err(Ignored::BadField("manifest")),
        };
        let scalars = m.scalar_fields.as_str();
        if !self.transfers.keep_nested(index, manifest, scalars) {
            return abort(self, FailReason::TooLarge);
        }
        let seq = self.transfers.next_seq();
        let inserted = self.transfers.records.insert(Transfer {
            id,
            seq,
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
            queued: false,
            prev: NONE,
            next: NONE,
            staged_at: now,
            pushed_at: now,
            ready_at: now,
        });
        let Ok(index) = inserted else {
            return abort(self, FailReason::TableFull);
        };
        self.enqueue(index);
        self.dispatch_role(now, sender_role);
        Ok(())
    }

    /// Fails the leg `sender_role` staged as `id` before it was taken:
    /// the sender is told why, and so is the application.
    fn refuse_staged(
        &mut self,
        from: PeerId,
        id: RequestId,
        sender_role: usize,
        reason: FailReason,
    ) {
        let abort = OutMsg::Abort {
            id,
            reason: reason.as_str(),
            source_role: sender_role,
        };
        self.send(from, abort);
        self.stats.failed += 1;
        self.event(CoordinatorEvent::Failed {
            id,
            leg: sender_role,
            reason,
        });
    }

    /// Picks a receiver of role `role` with capacity, by policy: the top
    /// of the role's ranking. Under [`Policy::MostFreeSlots`] the ranking
    /// counts free preallocated slots whatever their size, which is exact
    /// when the top's free slots all fit `data_size`; when no slot of the
    /// role fits it, the one with the most room is the answer; only where
    /// the role's slots are of mixed sizes, some fitting, are its receivers
    /// with room compared one by one.
    pub(super) fn choose(&mut self, role: usize, data_size: u64) -> Option<usize> {
        let (_, top) = self.registry.ranking.peek(role)?;
        match self.config.policy {
            Policy::RoundRobin => {
                self.registry.picks += 1;
                if let Some(mut m) = self.registry.members.get_mut(top) {
                    m.last_pick = self.registry.picks;
                }
                Some(top)
            }
            Policy::MostFreeSlots => {
                let m = self.registry.members.get(top)?;
                if m.prealloc.free_fitting(data_size) == m.prealloc.free() {
                    return Some(top);
                }
                let (_, largest) = self.registry.slot_bounds.get(role).copied()?;
                if data_size > largest {
                    return self.registry.room_ranking.peek(role).map(|(_, i)| i);
                }
                self.registry
                    .ranking
                    .lane(role)
                    .iter()
                    .filter_map(|&(_, i)| {
                        let m = self.registry.members.get(i as usize)?;
                        Some((
                            (
                                m.prealloc.free_fitting(data_size),
                                m.capacity.available(),
                                u32::MAX - i,
                            ),
                            i as usize,
                        ))
                    })
                    .max()
                    .map(|(_, i)| i)
            }
        }
    }

    /// Takes the smallest and largest preallocated slot of `role`'s
    /// members anew (once per member that comes or goes).
    pub(super) fn bound_slots(&mut self, role: usize) {
        let bounds = self
            .registry
            .members
            .iter()
            .flatten()
            .filter(|m| m.role == role)
            .flat_map(|m| m.prealloc.iter())
            .fold((u64::MAX, 0), |(lo, hi), s| {
                (lo.min(s.size), hi.max(s.size))
            });
        if let Some(b) = self.registry.slot_bounds.get_mut(role) {
            *b = bounds;
        }
    }

    /// Ranks member `index` anew after its capacity or preallocated slots
    /// changed (or it came): in its role's ranking while it has room, by
    /// the policy's key; and its taken slots counted into the total.
    pub(super) fn rank(&mut self, index: usize) {
        let policy = self.config.policy;
        let Some(mut m) = self.registry.members.get_mut(index) else {
            return;
        };
        let taken = m.prealloc.len() - m.prealloc.free();
        let counted = core::mem::replace(&mut m.counted_taken, taken);
        let (role, available, free, last_pick, draining) = (
            m.role,
            m.capacity.available(),
            m.prealloc.free(),
            m.last_pick,
            m.draining,
        );
        // A draining member with nothing addressed to it (no allocation,
        // no preallocated slot taken or parked) is told its drain is over.
        let drained = draining && !m.drain_told && m.capacity.in_use() == 0 && taken == 0;
        if drained {
            m.drain_told = true;
        }
        let (peer, session) = (m.peer, m.session);
        drop(m);
        if drained {
            self.send(peer, OutMsg::Drained { session });
        }
        self.registry.prealloc_taken =
            (self.registry.prealloc_taken + taken).saturating_sub(counted);
        if available == 0 || draining {
            self.registry.ranking.remove(index);
            self.registry.room_ranking.remove(index);
            return;
        }
        // Most room, then table order.
        let room = (0xff_ffff - u64::from(available.min(0xff_ffff))) << 24;
        self.registry
            .room_ranking
            .set(role, index, room | (index as u64).min(0xff_ffff));
        let key = match policy {
            // Chosen longest ago first; never chosen, in table order.
            Policy::RoundRobin => last_pick,
            // Most free slots, then most room, then table order.
            Policy::MostFreeSlots => {
                let free = 0xffff - free.min(0xffff) as u64;
                let room = 0xff_ffff - u64::from(available.min(0xff_ffff));
                (free << 48) | (room << 24) | (index as u64).min(0xff_ffff)
            }
        };
        self.registry.ranking.set(role, index, key);
    }

    /// Tries to hand transfer `index` (queued) to a receiver.
    pub(super) fn dispatch(&mut self, now: Instant, index: usize) {
        let Some(t) = self.transfers.records.get(index) else {
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
        // No room anywhere: it stays queued for a capacity release.
        let Some(r) = self.choose(role, data_size) else {
            return;
        };
        let Some(mut m) = self.registry.members.get_mut(r) else {
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
        drop(m);
        self.rank(r);
        self.unqueue(index);
        let Some(mut t) = self.transfers.records.get_mut(index) else {
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
                drop(t);
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
                drop(t);
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
}
