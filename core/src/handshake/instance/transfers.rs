//! The requests this instance is part of: their table with each one's
//! nested JSON, the writes that landed before their ready, the index of
//! those awaiting their write, the allocations held for room, and the
//! tombstones of those that ended.

use super::*;

/// The requests and what finds them.
#[derive(Debug)]
pub(super) struct Transfers<'s> {
    pub(super) requests: Table<'s, Request>,
    /// Each request's manifest and scalar fields: `chunk` bytes at its
    /// table index.
    pub(super) nested: ManagedSlice<'s, u8>,
    pub(super) chunk: usize,
    pub(super) arrivals: Arrivals<'s>,
    /// Requests awaiting their write's arrival, by tag; `landing_hashes`
    /// says what each place is indexed under (0: nothing).
    landing_index: Index<'s>,
    landing_hashes: ManagedSlice<'s, u64>,
    /// A request could not be indexed there (more than the probe bound
    /// await writes whose tags share their low 16 bits, which a sender
    /// choosing ids could arrange): arrivals are looked for by reading the
    /// table until no request awaits one.
    landing_scan: bool,
    /// `transfer_alloc`s held for room, oldest first (entries whose
    /// request moved on are skipped).
    pub(super) held: Ring<'s, Token>,
    tombstones: Graveyard<'s>,
    /// The last token's sequence number.
    seq: u64,
}

/// The transfers' storage.
pub struct TransfersStorage<'s> {
    /// The requests in flight, each with its share of nested bytes.
    pub live: RequestsStorage<'s, Request>,
    /// Requests aborted or received here, newest overwriting oldest, so
    /// that late and duplicated messages about them are ignored. It should
    /// hold the requests that end within the control plane's longest delay.
    pub tombstones: GraveyardStorage<'s>,
    /// Writes that landed before their `transfer_ready` (where
    /// [`InstanceIdentity::delivery_complete`] is false), with deadlines.
    pub arrivals: TableStorage<'s, Arrival>,
    /// The requests awaiting their write's arrival, by tag.
    pub landing_index: ManagedSlice<'s, u64>,
    /// What each request place is indexed under there.
    pub landing_hashes: ManagedSlice<'s, u64>,
    /// `transfer_alloc`s held for room, oldest first.
    pub held: ManagedSlice<'s, Option<Token>>,
}

/// The lengths of a [`TransfersStorage`]'s slices
/// ([`TransfersStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransfersSizes {
    /// `live`.
    pub live: RequestsSizes,
    /// `tombstones`.
    pub tombstones: GraveyardSizes,
    /// `arrivals`.
    pub arrivals: TableSizes,
    /// `landing_index`.
    pub landing_index: usize,
    /// `landing_hashes`.
    pub landing_hashes: usize,
    /// `held`.
    pub held: usize,
}

impl TransfersStorage<'_> {
    /// The lengths for `limits`: `requests` in flight, each with
    /// `nested_per_request` bytes of nested JSON, and `tombstones` ended
    /// requests remembered.
    pub fn storage_needed(limits: &Limits) -> TransfersSizes {
        let n = limits.requests.max(1);
        TransfersSizes {
            live: RequestsStorage::<Request>::storage_needed(limits),
            tombstones: GraveyardStorage::storage_needed(limits.tombstones),
            // One arrival per request in flight.
            arrivals: TableStorage::<Arrival>::storage_needed(n, true),
            landing_index: Index::places_for(n),
            landing_hashes: n,
            // Twice the requests: live entries are at most half of it, so
            // compacting out those whose requests moved on makes room.
            held: 2 * n,
        }
    }

    /// The limits these slices were sized for: the requests and
    /// tombstones they hold, and the nested bytes each request gets.
    pub fn limits(&self) -> Limits {
        self.live.limits(Limits {
            tombstones: self.tombstones.stones.len(),
            ..Limits::INSTANCE
        })
    }

    /// Refuses slices other than `needed` long, naming the first.
    pub fn check(&self, needed: &TransfersSizes) -> Result<(), StorageError> {
        self.live
            .check("transfers.live", "transfers.live.requests", &needed.live)?;
        self.tombstones
            .check("transfers.tombstones", &needed.tombstones)?;
        self.arrivals
            .check("transfers.arrivals", &needed.arrivals)?;
        StorageError::check_each(
            "transfers",
            [
                (
                    "landing_index",
                    needed.landing_index,
                    self.landing_index.len(),
                ),
                (
                    "landing_hashes",
                    needed.landing_hashes,
                    self.landing_hashes.len(),
                ),
                ("held", needed.held, self.held.len()),
            ],
        )
    }
}

#[cfg(feature = "alloc")]
impl TransfersStorage<'static> {
    /// Slices of its own, as long as `sizes` says.
    pub fn owned(sizes: &TransfersSizes) -> Self {
        use crate::managed::{empty, filled};
        Self {
            live: RequestsStorage::owned(&sizes.live),
            tombstones: GraveyardStorage::owned(&sizes.tombstones),
            arrivals: TableStorage::owned(sizes.arrivals.records, true),
            landing_index: filled(sizes.landing_index, 0),
            landing_hashes: filled(sizes.landing_hashes, 0),
            held: empty(sizes.held),
        }
    }
}

impl<'s> Transfers<'s> {
    pub(super) fn new(s: TransfersStorage<'s>, key: HashKey) -> Result<Self, InstanceError> {
        if s.live.requests.records.len() > MAX_REQUESTS {
            return Err(InstanceError::TooManyRequests { max: MAX_REQUESTS });
        }
        let needed = TransfersStorage::storage_needed(&s.limits());
        s.check(&needed).map_err(InstanceError::Storage)?;
        let chunk = s.live.chunk();
        let requests = Table::new(s.live.requests, key, true);
        let mut landing_hashes = s.landing_hashes;
        landing_hashes.iter_mut().for_each(|h| *h = 0);
        Ok(Self {
            requests,
            nested: s.live.nested,
            chunk,
            arrivals: Arrivals::new(s.arrivals, key),
            landing_index: Index::new(s.landing_index),
            landing_hashes,
            landing_scan: false,
            held: Ring::new(s.held),
            tombstones: Graveyard::new(s.tombstones, key),
            seq: 0,
        })
    }

    /// Places the indexes read so far.
    pub(super) fn probes(&self) -> u64 {
        self.requests.probes()
            + self.tombstones.probes()
            + self.arrivals.probes()
            + self.landing_index.probes()
    }

    pub(super) fn find(&self, id: JsonStr<'_>, side: Side) -> Option<usize> {
        let hash = self.requests.key().json::<ID_LEN>(id, NS_ID)?;
        self.requests
            .find(hash, |r| r.kind.side() == side && r.id.eq_json(id))
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

    /// Puts request `id` (its token's `seq`) at `index` in quarantine over
    /// `held` until `until`.
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

    /// Takes out the request `t` names if `is` holds for its kind: a token
    /// its request outlived, or one at another step, takes nothing.
    pub(super) fn take_if(&mut self, t: Token, is: fn(&Kind) -> bool) -> Option<Request> {
        self.request(t).filter(|r| is(&r.kind))?;
        self.requests.remove(t.index)
    }
}
