//! The coordinator's messages: registration answered, `transfer_alloc`,
//! `transfer_push`, `transfer_ready`.

use super::*;

impl<'s> Instance<'s> {
    /// Handles a message from the coordinator. `Err` says why it was
    /// ignored; it changed nothing.
    pub fn handle(&mut self, now: Instant, msg: &Msg<'_>) -> Result<(), Ignored> {
        if self.standing.left {
            self.stats.ignored += 1;
            return Err(Ignored::Left);
        }
        if self.standing.leaving.is_some() && !matches!(msg, Msg::Abort(_)) {
            // Leaving: only an abort of a write still out matters (its
            // completion then reports nothing).
            self.stats.ignored += 1;
            return Err(Ignored::Left);
        }
        let r = match msg {
            // ferry's coordinator: nothing is addressed to this draining
            // instance any more.
            Msg::Deregister(m) if !self.session.eq_json(m.session_id) => Err(Ignored::WrongPeer),
            Msg::Deregister(_) if !self.standing.draining => Err(Ignored::WrongState),
            Msg::Deregister(_) => {
                self.standing.drain_acked = true;
                Ok(())
            }
            Msg::RegisterAck(m) => {
                // An ack that names no session (a seed-era coordinator's)
                // answers whoever it reached: this endpoint is ours.
                if !m.session_id.is_empty() && !self.session.eq_json(m.session_id) {
                    Err(Ignored::WrongPeer)
                } else if self.standing.registered && self.standing.acks_owed > 0 {
                    // The answer to a registration resent while the first
                    // one's answer was on its way.
                    self.standing.acks_owed -= 1;
                    Ok(())
                } else if self.standing.registered {
                    Err(Ignored::Duplicate)
                } else {
                    self.standing.acks_owed = self.standing.acks_owed.saturating_sub(1);
                    self.standing.registered = m.accepted;
                    self.standing.refused = !m.accepted;
                    self.standing.refusal = match m.error {
                        Some(why) if !m.accepted => Reason::from_json_truncated(why),
                        _ => Reason::EMPTY,
                    };
                    self.event(if m.accepted {
                        InstanceEvent::Registered
                    } else {
                        InstanceEvent::Refused
                    });
                    if m.accepted && self.standing.draining {
                        // A drain that began before the coordinator knew
                        // us: it learns of it now.
                        self.send(OutMsg::Deregister {
                            draining: true,
                            reason: Reason::truncated(leave::DRAINING),
                        });
                    }
                    Ok(())
                }
            }
            // A message for another session of this endpoint (a predecessor
            // that crashed) is not for us.
            Msg::Alloc(m)
                if !m.receiver_session_id.is_empty()
                    && !self.session.eq_json(m.receiver_session_id) =>
            {
                Err(Ignored::WrongPeer)
            }
            Msg::Ready(m)
                if !m.dest_session_id.is_empty() && !self.session.eq_json(m.dest_session_id) =>
            {
                Err(Ignored::WrongPeer)
            }
            Msg::Alloc(m) => self.on_alloc(now, m.request_id, m.data_size),
            Msg::Push(m) => self.on_push(
                now,
                m.request_id,
                m.dest_session_id,
                m.dest_addr,
                m.transfer_size,
            ),
            Msg::Ready(m) => self.on_ready(
                now,
                m.request_id,
                m.slot_offset,
                &m.manifest,
                m.scalar_fields,
            ),
            Msg::Abort(m) => {
                // Which side of this instance the leg is on: a coordinator
                // that does not say means whatever it holds of the request.
                let reason = m.reason;
                if m.source_role.is_empty() {
                    let send = self.on_abort(now, m.request_id, Side::Send, reason);
                    let recv = self.on_abort(now, m.request_id, Side::Recv, reason);
                    send.or(recv)
                } else if self.role.eq_json(m.source_role) {
                    self.on_abort(now, m.request_id, Side::Send, reason)
                } else {
                    self.on_abort(now, m.request_id, Side::Recv, reason)
                }
            }
            _ => Err(Ignored::UnexpectedType),
        };
        if r.is_err() {
            self.stats.ignored += 1;
        }
        self.retry_held(now);
        r
    }

    pub(super) fn on_alloc(
        &mut self,
        now: Instant,
        id: JsonStr<'_>,
        data_size: u64,
    ) -> Result<(), Ignored> {
        if self.transfers.tombstoned(id, Side::Recv) {
            return Err(Ignored::Aborted);
        }
        if self.transfers.find(id, Side::Recv).is_some() {
            return Err(Ignored::Duplicate);
        }
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        if self.standing.draining {
            // Another receiver may take it: retryable at ferry's
            // coordinator, failed at once at sglang's (holding it would only
            // fail it later).
            self.stats.rejected += 1;
            match self.config.head {
                Head::Ferry => self.send(OutMsg::Reject {
                    id: rid,
                    retryable: true,
                    reason: leave::DRAINING,
                }),
                Head::Sglang => self.done(rid, Some(Reason::truncated(leave::DRAINING))),
            }
            return Ok(());
        }
        let reject = |me: &mut Self, retryable: bool, reason: &'static str| {
            match me.config.head {
                Head::Ferry => {
                    me.stats.rejected += 1;
                    me.send(OutMsg::Reject {
                        id: rid,
                        retryable,
                        reason,
                    });
                }
                // sglang's head reads no reject: wait for room, or say at
                // once in a message it reads that this will never fit.
                Head::Sglang if retryable => me.hold_alloc(now, rid, data_size),
                Head::Sglang => {
                    me.stats.rejected += 1;
                    me.done(rid, Some(Reason::truncated(reason)));
                }
            }
            Ok(())
        };
        if self.transfers.requests.is_full() {
            return reject(self, true, "instance request table full");
        }
        // Allocations may take the table only up to the room the
        // preallocated slots need: a fast-path `transfer_ready` always
        // finds a place, however many ALLOCs (forged ones included) wait.
        let by_alloc = self.transfers.requests.tally(CLASS_BY_ALLOC);
        let alloc_room = self
            .transfers
            .requests
            .capacity()
            .saturating_sub(self.slots.prealloc.len())
            .max(1);
        if by_alloc >= alloc_room {
            const FULL: &str =
                "instance request table full (the rest is kept for preallocated slots)";
            if self.config.head == Head::Sglang {
                // Held ALLOCs count too: another would only wait longer.
                self.stats.rejected += 1;
                self.done(rid, Some(Reason::truncated(FULL)));
                return Ok(());
            }
            return reject(self, true, FULL);
        }
        let slot = match self.slots.pool.allocate(data_size) {
            Ok(s) => s,
            Err(BuddyError::OutOfSpace { .. }) => return reject(self, true, "pool full"),
            Err(_) => return reject(self, false, "size cannot fit this pool"),
        };
        let (slot_offset, slot_size) = (slot.offset(), slot.size());
        let deadline = Some(now + self.config.reserved_timeout);
        if let Err(Kind::Reserved { slot }) =
            self.transfers
                .insert(rid, Kind::Reserved { slot }, deadline)
        {
            let _ = self.slots.pool.free(slot);
            return reject(self, true, "instance request table full");
        }
        self.send(OutMsg::Allocated {
            id: rid,
            slot_offset,
            slot_size,
        });
        Ok(())
    }

    pub(super) fn on_push(
        &mut self,
        now: Instant,
        id: JsonStr<'_>,
        dest_session: JsonStr<'_>,
        dest_addr: u64,
        transfer_size: u64,
    ) -> Result<(), Ignored> {
        if self.transfers.tombstoned(id, Side::Send) {
            return Err(Ignored::Aborted);
        }
        let index = self
            .transfers
            .find(id, Side::Send)
            .ok_or(Ignored::UnknownRequest)?;
        let dest_session =
            Name::from_json(dest_session).map_err(|_| Ignored::TooLong("dest_session_id"))?;
        let Some(r) = self.transfers.requests.remove(index) else {
            return Err(Ignored::UnknownRequest);
        };
        let (slot, staged) = match r.kind {
            Kind::Staged {
                slot,
                data_size,
                since,
            } if data_size == transfer_size => (slot, since),
            kind => {
                let why = match kind {
                    Kind::Writing { .. } => Ignored::Duplicate,
                    Kind::Staged { .. } => Ignored::BadField("transfer_size"),
                    _ => Ignored::WrongState,
                };
                self.transfers.requests.put(index, Request { kind, ..r });
                return Err(why);
            }
        };
        let write = Write {
            token: Token { index, seq: r.seq },
            id: r.id,
            local_offset: slot.offset(),
            len: transfer_size,
            dest_session,
            dest_addr,
            tag: WriteTag::of(r.id.as_str(), dest_addr),
        };
        self.transfers.requests.put(
            index,
            Request {
                kind: Kind::Writing {
                    slot,
                    len: transfer_size,
                    aborted: false,
                    staged,
                    posted: now,
                },
                deadline: None,
                ..r
            },
        );
        if !self.outbox.write(write) {
            self.stats.dropped += 1;
        }
        Ok(())
    }

    pub(super) fn on_ready(
        &mut self,
        now: Instant,
        id: JsonStr<'_>,
        slot_offset: u64,
        manifest: &Manifest<'_>,
        scalars: RawJson<'_>,
    ) -> Result<(), Ignored> {
        if self.transfers.tombstoned(id, Side::Recv) {
            return Err(Ignored::Aborted);
        }
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        // Where the data is: a slot reserved for this request, or a free
        // preallocated slot (the coordinator's fast path).
        let at_prealloc = self.slots.at(slot_offset);
        let free_prealloc = at_prealloc.filter(|&p| self.slots.uses[p].is_free());
        let mut found = self.transfers.find(id, Side::Recv);
        if let (Some(i), Some(_)) = (found, free_prealloc) {
            // A slot reserved by a duplicated `transfer_alloc` that the
            // coordinator never used (it took the fast path instead): no
            // write can target it, so it goes now.
            let stale = matches!(
                &self.transfers.requests[i],
                Some(Request { kind: Kind::Reserved { slot }, .. }) if slot.offset() != slot_offset
            );
            if stale {
                if let Some(Request {
                    kind: Kind::Reserved { slot },
                    ..
                }) = self.transfers.requests.remove(i)
                {
                    let _ = self.slots.pool.free(slot);
                }
                found = None;
            }
        }
        let (index, slot_size) = match found {
            Some(i) => match self.transfers.requests[i].as_ref().map(|r| &r.kind) {
                Some(Kind::Reserved { slot }) if slot.offset() == slot_offset => {
                    (Some(i), slot.size())
                }
                Some(Kind::Reserved { .. }) => return Err(Ignored::BadField("slot_offset")),
                Some(Kind::Landing { .. } | Kind::Delivered { .. }) => {
                    return Err(Ignored::Duplicate)
                }
                _ => return Err(Ignored::WrongState),
            },
            None => match at_prealloc {
                Some(p) if self.slots.uses[p].is_free() => (None, self.slots.prealloc[p].size),
                Some(_) => return Err(Ignored::WrongState),
                None => return Err(Ignored::UnknownRequest),
            },
        };
        let total = manifest_len(manifest) + scalars.as_str().len();
        let fits = check_manifest(manifest, slot_size).is_ok() && total <= self.transfers.chunk;
        let index = match index {
            Some(i) => i,
            None => {
                let p = at_prealloc.ok_or(Ignored::UnknownRequest)?;
                if !fits {
                    // Nothing to free: the slot is the coordinator's to give back.
                    self.refuse_prealloc(now, p, rid, "manifest does not fit the slot");
                    return Ok(());
                }
                match self.transfers.insert(
                    rid,
                    Kind::Delivered {
                        held: Held::Prealloc(p),
                        aborted: false,
                    },
                    None,
                ) {
                    Ok(t) => {
                        self.slots.set_use(p, PreallocUse(Use::Request));
                        t.index
                    }
                    Err(_) => {
                        self.refuse_prealloc(now, p, rid, "instance request table full");
                        return Ok(());
                    }
                }
            }
        };
        let Some(r) = self.transfers.requests.remove(index) else {
            return Err(Ignored::UnknownRequest);
        };
        let held = match r.kind {
            Kind::Reserved { slot } if !fits => {
                const WHY: &str = "manifest does not fit the slot";
                match self.landing {
                    // The write may still be landing: the slot sits out the
                    // time it may take, then the refusal goes out.
                    Some(limit) => {
                        self.transfers.tombstone(r.id, Side::Recv);
                        let until = now + limit + self.config.quarantine;
                        self.transfers.quarantine(
                            index,
                            (r.id, r.seq),
                            Held::Pool(slot),
                            until,
                            Some(WHY),
                        );
                    }
                    // The write is done (the coordinator saw
                    // `transfer_pushed`): the slot can go at once.
                    None => {
                        let _ = self.slots.pool.free(slot);
                        self.done(r.id, Some(Reason::truncated(WHY)));
                    }
                }
                return Ok(());
            }
            Kind::Reserved { slot } => Held::Pool(slot),
            Kind::Delivered { held, .. } => held,
            other => {
                self.transfers
                    .requests
                    .put(index, Request { kind: other, ..r });
                return Err(Ignored::WrongState);
            }
        };
        let seq = r.seq;
        // Where a completion does not mean delivery, the data plane must
        // say the bytes arrived before the application may read them (it
        // may have said so already).
        let tag = WriteTag::of(r.id.as_str(), self.pool_ptr + slot_offset);
        let gate = self.landing;
        let (kind, deadline) = match gate {
            Some(limit) if !self.transfers.arrivals.take(now, tag) => {
                (Kind::Landing { held, tag }, Some(now + limit))
            }
            _ => (
                Kind::Delivered {
                    held,
                    aborted: false,
                },
                None,
            ),
        };
        let landing = matches!(kind, Kind::Landing { .. });
        if landing {
            self.transfers.await_landing(index, tag);
        }
        self.transfers.requests.put(
            index,
            Request {
                kind,
                deadline,
                ..r
            },
        );
        let base = index * self.transfers.chunk;
        let mut sink = Sink::new(&mut self.transfers.nested[base..base + self.transfers.chunk]);
        manifest.write_json(&mut sink, Default::default());
        let m_len = sink.len();
        write_scalars(&mut sink, scalars);
        let s_len = sink.len() - m_len;
        if let Some(mut r) = self.transfers.requests.get_mut(index) {
            r.manifest_len = m_len;
            r.scalars_len = s_len;
        }
        if !landing {
            self.stats.received += 1;
            self.event(InstanceEvent::Received(Token { index, seq }));
        }
        Ok(())
    }

    /// Refuses a `transfer_ready` into preallocated slot `p` that no request
    /// record holds. Where completions mean delivery the write is done and
    /// the coordinator may reuse the slot at once; elsewhere the bytes may
    /// still come, so the slot is held (without a record: the table may be
    /// full) for as long as they may take, and the refusal goes out then.
    pub(super) fn refuse_prealloc(
        &mut self,
        now: Instant,
        p: usize,
        id: RequestId,
        why: &'static str,
    ) {
        match self.landing {
            Some(limit) => {
                self.transfers.tombstone(id, Side::Recv);
                self.slots.set_use(
                    p,
                    PreallocUse(Use::Refused {
                        id,
                        until: now + limit + self.config.quarantine,
                        report: Some(why),
                    }),
                );
            }
            None => self.done(id, Some(Reason::truncated(why))),
        }
    }
}

/// The key under which sglang's head names the preallocated slot of a
/// fast-path `transfer_ready`, inside its scalar fields.
const PREALLOC_SLOT_KEY: &str = "_prealloc_slot_id";

/// Writes the scalar fields the application is to see: as relayed, less
/// the head's `_prealloc_slot_id` (sglang's receiver pops it; ferry finds
/// the slot by its offset), so that a forward does not pass it on.
fn write_scalars(sink: &mut Sink<'_>, scalars: RawJson<'_>) {
    let has_key = scalars
        .members()
        .any(|m| m.is_ok_and(|(k, _)| k.eq_str(PREALLOC_SLOT_KEY)));
    if !has_key {
        sink.put(scalars.as_str().as_bytes());
        return;
    }
    sink.byte(b'{');
    let mut first = true;
    for (k, v) in scalars.members().flatten() {
        if k.eq_str(PREALLOC_SLOT_KEY) {
            continue;
        }
        if !first {
            sink.byte(b',');
        }
        first = false;
        k.write_json(sink);
        sink.byte(b':');
        sink.put(v.as_str().as_bytes());
    }
    sink.byte(b'}');
}
