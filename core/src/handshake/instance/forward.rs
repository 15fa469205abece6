//! Forwarding (a received request let go of and its next leg staged in one
//! step; under sglang's head in one message, as its denoiser sends it) and,
//! under sglang's head, `transfer_alloc`s held until room frees.

use super::*;

impl<'s> Instance<'s> {
    /// Ends the receive side of a request and announces its next leg:
    /// `received` is the delivery the application holds (its slot is
    /// freed), `staged` a slot from [`stage`](Self::stage) for the same
    /// request id, filled with `data_size` bytes laid out as `manifest`.
    ///
    /// Under [`Head::Sglang`] it is one message, sglang's
    /// `transfer_done{staged_for_decoder}`, which that head needs from a
    /// denoiser. Under [`Head::Ferry`] it is `transfer_staged` then
    /// `transfer_done`, which every coordinator since the seed reads (ferry's
    /// also takes the one message, from sglang's own instances). On any
    /// error nothing changed.
    pub fn forward(
        &mut self,
        now: Instant,
        received: Token,
        staged: Token,
        data_size: u64,
        manifest: &Manifest<'_>,
        scalar_fields: RawJson<'_>,
    ) -> Result<(), InstanceError> {
        let rx_id = match self.transfers.request(received).map(|r| (&r.kind, r.id)) {
            Some((Kind::Delivered { .. }, id)) => id,
            _ => return Err(InstanceError::StaleToken),
        };
        match self.transfers.request(staged) {
            Some(r) if matches!(r.kind, Kind::Filling { .. }) && r.id == rx_id => {}
            Some(r) if matches!(r.kind, Kind::Filling { .. }) => return Err(InstanceError::BadId),
            _ => return Err(InstanceError::StaleToken),
        }
        // The commit's checks (size, nested JSON room) apply unchanged; the
        // announcement is the forward.
        let one_message = self.config.head == Head::Sglang;
        self.commit_as(now, staged, data_size, manifest, scalar_fields, one_message)?;
        self.stats.forwarded += 1;
        if let Some(Request {
            id,
            kind: Kind::Delivered { held, .. },
            ..
        }) = self.transfers.requests.remove(received.index)
        {
            self.slots.free_held(held);
            if one_message {
                // As `done` does, but the forward is the report.
                self.transfers.tombstone(id, Side::Recv);
            } else {
                self.done(id, None);
            }
        }
        self.retry_held(now);
        Ok(())
    }

    /// Holds a `transfer_alloc` that found no room (sglang's head reads no
    /// reject): it is retried as room frees, and failed with
    /// `transfer_done` at the hold's end.
    pub(super) fn hold_alloc(&mut self, now: Instant, id: RequestId, data_size: u64) {
        let deadline = Some(now + self.config.alloc_hold);
        match self
            .transfers
            .insert(id, Kind::AllocHeld { data_size }, deadline)
        {
            Ok(token) => {
                self.stats.allocs_held += 1;
                self.queue_held(token);
            }
            Err(_) => {
                self.stats.rejected += 1;
                self.done(id, Some(Reason::truncated("instance request table full")));
            }
        }
    }

    /// True if `token` names a held `transfer_alloc`: its size if so.
    fn held_size(&self, token: Token) -> Option<u64> {
        match self.transfers.request(token)?.kind {
            Kind::AllocHeld { data_size } => Some(data_size),
            _ => None,
        }
    }

    /// Puts a held `transfer_alloc` at the back of the queue; a queue full
    /// of entries whose requests moved on is compacted first (live ones
    /// are at most half of it).
    fn queue_held(&mut self, token: Token) {
        if self.transfers.held.push(token).is_ok() {
            return;
        }
        for _ in 0..self.transfers.held.len() {
            if let Some(t) = self.transfers.held.pop() {
                if self.held_size(t).is_some() {
                    let _ = self.transfers.held.push(t);
                }
            }
        }
        if self.transfers.held.push(token).is_err() {
            self.stats.dropped += 1;
        }
    }

    /// [`retry_held`](Self::retry_held) from a call that takes no time:
    /// the latest time seen stands in.
    pub(super) fn retry_held_untimed(&mut self) {
        self.retry_held(self.last_now);
    }

    /// Gives held `transfer_alloc`s the room that freed, oldest first.
    pub(super) fn retry_held(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        if self.config.head != Head::Sglang {
            // Only that head's ALLOCs are ever held.
            return;
        }
        while let Some(&token) = self.transfers.held.front() {
            let Some(data_size) = self.held_size(token) else {
                // Its request moved on (granted, aborted, timed out).
                self.transfers.held.pop();
                continue;
            };
            let Ok(slot) = self.slots.pool.allocate(data_size) else {
                return;
            };
            self.transfers.held.pop();
            let Some(r) = self.transfers.requests.remove(token.index) else {
                let _ = self.slots.pool.free(slot);
                return;
            };
            let (slot_offset, slot_size) = (slot.offset(), slot.size());
            self.transfers.requests.put(
                token.index,
                Request {
                    kind: Kind::Reserved { slot },
                    deadline: Some(now + self.config.reserved_timeout),
                    ..r
                },
            );
            self.send(OutMsg::Allocated {
                id: r.id,
                slot_offset,
                slot_size,
            });
        }
    }
}
