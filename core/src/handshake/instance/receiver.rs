//! What the application holds as receiver: the view of a received transfer,
//! and its release.

use super::*;

impl<'s> Instance<'s> {
    /// The transfer `token` names, while the application holds it.
    pub fn received(&self, token: Token) -> Option<Received<'_>> {
        let r = self
            .transfers
            .requests
            .get(token.index)
            .filter(|r| r.seq == token.seq)?;
        let Kind::Delivered { held, aborted } = &r.kind else {
            return None;
        };
        let aborted = *aborted;
        let (slot_offset, slot_size) = match held {
            Held::Pool(h) => (h.offset(), h.size()),
            Held::Prealloc(i) => self.slots.prealloc.get(*i).map(|s| (s.offset, s.size))?,
        };
        let (manifest, scalar_fields) = nested_json(
            &self.transfers.nested,
            token.index * self.transfers.chunk,
            r.manifest_len,
            r.scalars_len,
        );
        Some(Received {
            id: r.id.as_str(),
            slot_offset,
            slot_size,
            manifest: Manifest::Raw(manifest),
            scalar_fields,
            aborted,
        })
    }

    /// The application is done with a received transfer: its slot is freed
    /// and `transfer_done` (with `error`, if any, cut at
    /// [`REASON_LEN`](crate::handshake::REASON_LEN) bytes) goes to the
    /// coordinator. Under [`Head::Sglang`] only a failure is reported: that
    /// head takes a plain `transfer_done` as the request's end, so a good
    /// receive is reported by what the application sends next (a forward,
    /// or the decoder's output, sent after this release: the head reuses
    /// a preallocated slot once it has the output).
    pub fn release(&mut self, token: Token, error: Option<&str>) -> Result<(), InstanceError> {
        let delivered = |k: &Kind| matches!(k, Kind::Delivered { .. });
        let Some(Request {
            id,
            kind: Kind::Delivered { held, .. },
            ..
        }) = self.transfers.take_if(token, delivered)
        else {
            return Err(InstanceError::StaleToken);
        };
        self.slots.free_held(held);
        match (self.config.head, error) {
            // sglang's head learns of a good receive from what follows it
            // (the decoder's output, a denoiser's forward); a plain
            // `transfer_done` would end the request there with no result.
            (Head::Sglang, None) => self.transfers.tombstone(id, Side::Recv),
            (_, error) => self.done(id, error.map(Reason::truncated)),
        }
        // The room may be what a held `transfer_alloc` waits for; the
        // clock is the held requests' own (their deadline is not moved).
        self.retry_held_untimed();
        Ok(())
    }

    /// Reports `transfer_done` for `id` and tombstones it: a duplicated
    /// `transfer_ready` arriving later must not deliver the request again
    /// (its preallocated slot may hold another request's data by then).
    pub(super) fn done(&mut self, id: RequestId, error: Option<Reason>) {
        self.transfers.tombstone(id, Side::Recv);
        if self.standing.leaving.is_some() {
            // `leave` told the coordinator of everything held.
            return;
        }
        self.send(OutMsg::Done { id, error });
    }
}
