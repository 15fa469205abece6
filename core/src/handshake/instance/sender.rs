//! The sending side: stage a request, commit it, write on `transfer_push`,
//! report the completion.

use super::*;

impl<'s> Instance<'s> {
    /// Reserves a slot of `data_size` bytes to stage request `id` in. Fill
    /// it at the returned offset of the pool, then call
    /// [`commit`](Self::commit).
    pub fn stage(&mut self, id: &str, data_size: u64) -> Result<(Token, u64), InstanceError> {
        let id = RequestId::new(id).map_err(|_| InstanceError::BadId)?;
        // A drain finishes work in flight: the next leg of a request this
        // instance holds as receiver (a forward) is still staged.
        if self.standing.draining
            && (self.standing.leaving.is_some()
                || self.transfers.find(id.as_json(), Side::Recv).is_none())
        {
            return Err(InstanceError::Draining);
        }
        if self.transfers.find(id.as_json(), Side::Send).is_some() {
            return Err(InstanceError::BadId);
        }
        if self.transfers.requests.is_full() {
            return Err(InstanceError::TableFull);
        }
        let slot = self
            .slots
            .pool
            .allocate(data_size)
            .map_err(InstanceError::Pool)?;
        let offset = slot.offset();
        match self.transfers.insert(id, Kind::Filling { slot }, None) {
            Ok(t) => Ok((t, offset)),
            Err(Kind::Filling { slot }) => {
                let _ = self.slots.pool.free(slot);
                Err(InstanceError::TableFull)
            }
            Err(_) => Err(InstanceError::TableFull),
        }
    }

    /// Announces a filled slot to the coordinator (`transfer_staged`).
    /// `data_size` bytes from the slot's start will be written.
    pub fn commit(
        &mut self,
        now: Instant,
        token: Token,
        data_size: u64,
        manifest: &Manifest<'_>,
        scalar_fields: RawJson<'_>,
    ) -> Result<(), InstanceError> {
        self.commit_as(now, token, data_size, manifest, scalar_fields, false)
    }

    /// [`commit`](Self::commit), announced as a forward if `forward`.
    pub(super) fn commit_as(
        &mut self,
        now: Instant,
        token: Token,
        data_size: u64,
        manifest: &Manifest<'_>,
        scalar_fields: RawJson<'_>,
        forward: bool,
    ) -> Result<(), InstanceError> {
        let chunk = self.transfers.chunk;
        let base = token.index * chunk;
        let timeout = self.config.staged_timeout;
        let r = self
            .transfers
            .requests
            .get(token.index)
            .filter(|r| r.seq == token.seq);
        let Some(r) = r else {
            return Err(InstanceError::StaleToken);
        };
        let Kind::Filling { slot } = &r.kind else {
            return Err(InstanceError::StaleToken);
        };
        if data_size > slot.size() {
            return Err(InstanceError::Pool(BuddyError::TooLarge {
                requested: data_size,
                max_slot: slot.size(),
            }));
        }
        let Some(dst) = self.transfers.nested.get_mut(base..base + chunk) else {
            return Err(InstanceError::TooLarge);
        };
        let mut sink = Sink::new(dst);
        manifest.write_json(&mut sink, Default::default());
        let manifest_len = sink.len();
        sink.put(scalar_fields.as_str().as_bytes());
        let total = sink.len();
        if sink.finish().is_err() {
            return Err(InstanceError::TooLarge);
        }
        let Some(r) = self.transfers.requests.remove(token.index) else {
            return Err(InstanceError::StaleToken);
        };
        let Kind::Filling { slot } = r.kind else {
            self.transfers.requests.put(token.index, r);
            return Err(InstanceError::StaleToken);
        };
        self.transfers.requests.put(
            token.index,
            Request {
                kind: Kind::Staged {
                    slot,
                    data_size,
                    since: now,
                },
                manifest_len,
                scalars_len: total - manifest_len,
                deadline: Some(now + timeout),
                ..r
            },
        );
        self.stats.staged += 1;
        let (index, seq) = (token.index, token.seq);
        self.send(if forward {
            OutMsg::Forward { index, seq }
        } else {
            OutMsg::Staged { index, seq }
        });
        Ok(())
    }

    /// Gives up a slot from [`stage`](Self::stage) that was never committed.
    pub fn unstage(&mut self, token: Token) -> Result<(), InstanceError> {
        let filling = |k: &Kind| matches!(k, Kind::Filling { .. });
        let Some(Request {
            kind: Kind::Filling { slot },
            ..
        }) = self.transfers.take_if(token, filling)
        else {
            return Err(InstanceError::StaleToken);
        };
        let _ = self.slots.pool.free(slot);
        self.retry_held_untimed();
        Ok(())
    }

    /// The data plane finished (or failed) a write from [`poll_action`].
    /// A failure's text (the data plane's own error, say) goes to the
    /// coordinator in `transfer_pushed.error`, cut at [`REASON_LEN`]
    /// bytes.
    ///
    /// Returns the bytes the write carried.
    ///
    /// [`poll_action`]: Self::poll_action
    /// [`REASON_LEN`]: crate::handshake::REASON_LEN
    pub fn handle_completion(
        &mut self,
        now: Instant,
        token: Token,
        result: Result<(), &str>,
    ) -> Result<u64, Ignored> {
        let r = self
            .transfers
            .request(token)
            .ok_or(Ignored::UnknownRequest)?;
        if !matches!(r.kind, Kind::Writing { .. }) {
            return Err(Ignored::WrongState);
        }
        let Some(Request {
            id,
            kind:
                Kind::Writing {
                    slot,
                    len,
                    aborted,
                    staged,
                    posted,
                },
            ..
        }) = self.transfers.requests.remove(token.index)
        else {
            return Err(Ignored::WrongState);
        };
        let _ = self.slots.pool.free(slot);
        self.retry_held(now);
        if aborted {
            // The coordinator gave up already; it wants no report.
            self.finish_leaving();
            return Ok(len);
        }
        // sglang's head reads no failure in `transfer_pushed` (it would
        // announce the unwritten slot ready), and a `transfer_done` with an
        // error from a forwarding sender makes it return the receiver's
        // preallocated slot to the sender's list; nothing goes out, and
        // the head fails the request at its timeout.
        if result.is_ok() || self.config.head == Head::Ferry {
            self.send(OutMsg::Pushed {
                id,
                error: result.err().map(Reason::truncated),
            });
        }
        if result.is_ok() {
            self.stats.sent += 1;
            let timing = SendTiming {
                queued: posted.since(staged),
                written: now.since(posted),
            };
            self.event(InstanceEvent::Sent { id, timing });
        } else {
            let reason = Reason::truncated(result.err().unwrap_or("write failed"));
            self.event(InstanceEvent::SendFailed { id, reason });
        }
        // A leaving instance says it is gone once its last write is in,
        // after that write's report.
        self.finish_leaving();
        Ok(len)
    }
}
