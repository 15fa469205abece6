//! The bookkeeping under every message: queuing what goes out, finding a
//! request, a preallocated slot or a write awaiting its arrival,
//! tombstones, quarantine, and freeing what a request held.

use super::*;

impl<'s> Instance<'s> {
    pub(super) fn send(&mut self, m: OutMsg) {
        if self.left {
            // `leave` said all there is to say.
            return;
        }
        if self.transmits.push(Outgoing(m)).is_err() {
            self.stats.dropped += 1;
        }
    }

    pub(super) fn event(&mut self, e: InstanceEvent) {
        if self.events.push(e).is_err() {
            self.stats.dropped += 1;
        }
    }

    pub(super) fn find(&self, id: JsonStr<'_>, side: Side) -> Option<usize> {
        let hash = self.requests.key().json::<ID_LEN>(id, NS_ID)?;
        self.requests
            .find(hash, |r| r.kind.side() == side && r.id.eq_json(id))
    }

    /// The preallocated slot at `offset`.
    pub(super) fn prealloc_at(&self, offset: u64) -> Option<usize> {
        let hash = self.requests.key().number(offset, NS_OFFSET);
        self.prealloc_index.find(hash, |p| {
            self.prealloc.get(p).is_some_and(|s| s.offset == offset)
        })
    }

    /// Sets what holds preallocated slot `p`, keeping the count of slots
    /// in use and the refusals' deadlines.
    pub(super) fn set_use(&mut self, p: usize, u: PreallocUse) {
        let Some(slot) = self.prealloc_use.get_mut(p) else {
            return;
        };
        let was_busy = !slot.is_free();
        *slot = u;
        self.prealloc_busy =
            (self.prealloc_busy + usize::from(!u.is_free())).saturating_sub(usize::from(was_busy));
        match u.0 {
            Use::Refused { until, .. } => self.prealloc_timers.set(0, p, until.as_nanos()),
            _ => self.prealloc_timers.remove(p),
        }
    }

    /// Indexes request `index`, now awaiting the arrival of the write
    /// tagged `tag`.
    pub(super) fn await_landing(&mut self, index: usize, tag: WriteTag) {
        let hash = tag_hash(self.requests.key(), Landed::of(tag).low16());
        if self.requests.tally(CLASS_LANDING) == 0 {
            self.landing_scan = false;
        }
        if let Some(old) = self.landing_hashes.get(index).copied().filter(|&h| h != 0) {
            self.landing_index.remove(old, index);
        }
        let indexed = self.landing_index.insert(hash, index).is_ok();
        self.landing_scan |= !indexed;
        if let Some(h) = self.landing_hashes.get_mut(index) {
            *h = if indexed { hash } else { 0 };
        }
    }

    /// The request awaiting the arrival `landed` names.
    pub(super) fn landing_of(&self, landed: Landed) -> Option<usize> {
        let waits =
            |r: &Request| matches!(r.kind, Kind::Landing { tag, .. } if landed.matches(tag));
        if self.requests.tally(CLASS_LANDING) == 0 {
            return None;
        }
        match landed.low16() {
            Some(_) if !self.landing_scan => {
                let hash = tag_hash(self.requests.key(), landed.low16());
                self.landing_index
                    .find(hash, |i| self.requests.get(i).is_some_and(waits))
            }
            _ => self
                .requests
                .iter()
                .position(|r| r.as_ref().is_some_and(waits)),
        }
    }

    pub(super) fn tombstoned(&self, id: JsonStr<'_>, side: Side) -> bool {
        self.tombstones.contains(id, Leg::Side(side))
    }

    pub(super) fn tombstone(&mut self, id: RequestId, side: Side) {
        self.tombstones.bury(id, Leg::Side(side));
    }

    /// Puts request `id` (its token's `seq`) at `index` in quarantine
    /// over `held`.
    /// Quarantines request `index`'s slot for the configured time from
    /// `now` (see [`quarantine`](Self::quarantine)).
    pub(super) fn sit_out(
        &mut self,
        index: usize,
        request: (RequestId, u64),
        held: Held,
        now: Instant,
        report: Option<&'static str>,
    ) {
        let until = now + self.config.quarantine;
        self.quarantine(index, request, held, until, report);
    }

    pub(super) fn quarantine(
        &mut self,
        index: usize,
        (id, seq): (RequestId, u64),
        held: Held,
        until: Instant,
        report: Option<&'static str>,
    ) {
        self.requests.put(
            index,
            Request {
                id,
                seq,
                kind: Kind::Quarantined { held, report },
                deadline: Some(until),
                manifest_len: 0,
                scalars_len: 0,
            },
        );
    }

    pub(super) fn insert(
        &mut self,
        id: RequestId,
        kind: Kind,
        deadline: Option<Instant>,
    ) -> Result<Token, Kind> {
        // Within a token cookie's bits; 2^48 requests before a wrap.
        let seq = (self.seq + 1) & SEQ_MASK;
        let index = self
            .requests
            .insert(Request {
                id,
                seq,
                kind,
                deadline,
                manifest_len: 0,
                scalars_len: 0,
            })
            .map_err(|r| r.kind)?;
        self.seq = seq;
        Ok(Token { index, seq })
    }

    pub(super) fn request(&self, t: Token) -> Option<&Request> {
        self.requests.get(t.index).filter(|r| r.seq == t.seq)
    }

    /// Frees what a request held: pool slots to the allocator, preallocated
    /// slots back to the table.
    pub(super) fn free_held(&mut self, held: Held) {
        match held {
            Held::Pool(h) => {
                // The handle came from this pool and is freed once.
                let _ = self.pool.free(h);
            }
            Held::Prealloc(i) => self.set_use(i, PreallocUse::FREE),
        }
    }
}
