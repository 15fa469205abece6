//! What the application holds as receiver: the view of a received transfer,
//! and its release.

use super::*;

impl<'s> Instance<'s> {
    /// The transfer `token` names, while the application holds it.
    pub fn received(&self, token: Token) -> Option<Received<'_>> {
        let r = self
            .requests
            .get(token.index)?
            .as_ref()
            .filter(|r| r.seq == token.seq)?;
        let Kind::Delivered { held, aborted } = &r.kind else {
            return None;
        };
        let aborted = *aborted;
        let (slot_offset, slot_size) = match held {
            Held::Pool(h) => (h.offset(), h.size()),
            Held::Prealloc(i) => self.prealloc.get(*i).map(|s| (s.offset, s.size))?,
        };
        let (manifest, scalar_fields) = nested_json(
            &self.nested,
            token.index * self.chunk,
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
    /// [`REASON_LEN`](crate::handshake::REASON_LEN) bytes) goes to the coordinator.
    pub fn release(&mut self, token: Token, error: Option<&str>) -> Result<(), InstanceError> {
        match self
            .request_mut(token)
            .map(|r| matches!(r.kind, Kind::Delivered { .. }))
        {
            Some(true) => {}
            _ => return Err(InstanceError::StaleToken),
        }
        let Some(Request {
            id,
            kind: Kind::Delivered { held, .. },
            ..
        }) = self.requests[token.index].take()
        else {
            return Err(InstanceError::StaleToken);
        };
        self.free_held(held);
        self.done(id, error.map(Reason::truncated));
        Ok(())
    }

    /// Reports `transfer_done` for `id` and tombstones it: a duplicated
    /// `transfer_ready` arriving later must not deliver the request again
    /// (its preallocated slot may hold another request's data by then).
    pub(super) fn done(&mut self, id: RequestId, error: Option<Reason>) {
        self.tombstone(id, Side::Recv);
        self.send(OutMsg::Done { id, error });
    }
}
