//! `transfer_abort`: a request ended elsewhere, on either side.

use super::*;

impl<'s> Instance<'s> {
    pub(super) fn on_abort(
        &mut self,
        now: Instant,
        id: JsonStr<'_>,
        side: Side,
        reason: JsonStr<'_>,
    ) -> Result<(), Ignored> {
        let rid = RequestId::from_json(id).map_err(|_| Ignored::TooLong("request_id"))?;
        // The coordinator's words, cut to fit.
        let why = Reason::from_json_truncated(reason);
        if self.transfers.tombstoned(id, side) {
            return Err(Ignored::Duplicate);
        }
        self.transfers.tombstone(rid, side);
        self.stats.aborted += 1;
        let Some(index) = self.transfers.find(id, side) else {
            // Nothing held here (a fast-path transfer not yet ready): the
            // tombstone keeps a late `transfer_ready` out.
            return Ok(());
        };
        let Some(r) = self.transfers.requests.get(index) else {
            return Ok(());
        };
        let token = Token { index, seq: r.seq };
        match r.kind {
            Kind::Filling { .. } => {
                // Not announced yet; the coordinator cannot mean it.
                return Err(Ignored::WrongState);
            }
            Kind::Writing { .. } => {
                if let Some(mut r) = self.transfers.requests.get_mut(index) {
                    if let Kind::Writing { aborted, .. } = &mut r.kind {
                        *aborted = true;
                    }
                }
                self.event(InstanceEvent::SendFailed {
                    id: rid,
                    reason: why,
                });
            }
            Kind::Delivered { .. } => {
                if let Some(mut r) = self.transfers.requests.get_mut(index) {
                    if let Kind::Delivered { aborted, .. } = &mut r.kind {
                        *aborted = true;
                    }
                }
                self.event(InstanceEvent::Aborted(token));
            }
            Kind::Landing { .. } => {
                // The bytes may still come: quarantine the slot, and say
                // when it is free again (the coordinator waits for that
                // before it reuses a preallocated slot).
                if let Some(r) = self.transfers.requests.remove(index) {
                    if let Kind::Landing { held, .. } = r.kind {
                        self.sit_out(index, (r.id, r.seq), held, now, Some(NEVER_LANDED));
                    }
                }
            }
            Kind::Quarantined { .. } => {}
            Kind::AllocHeld { .. } => {
                // Nothing reserved yet: the record goes.
                self.transfers.requests.remove(index);
            }
            Kind::Staged { .. } => {
                if let Some(Request {
                    kind: Kind::Staged { slot, .. },
                    ..
                }) = self.transfers.requests.remove(index)
                {
                    let _ = self.slots.pool.free(slot);
                }
                self.event(InstanceEvent::SendFailed {
                    id: rid,
                    reason: why,
                });
            }
            Kind::Reserved { .. } => {
                // A write may still land here: quarantine the slot.
                if let Some(r) = self.transfers.requests.remove(index) {
                    if let Kind::Reserved { slot } = r.kind {
                        self.sit_out(index, (r.id, r.seq), Held::Pool(slot), now, None);
                    }
                }
            }
        }
        Ok(())
    }
}
