//! The landing gate: where completions do not mean delivery, a received
//! transfer waits for the data plane to report its write landed; writes
//! reported before their `transfer_ready` are remembered for it.

use super::*;

/// A write the data plane reported landed before its `transfer_ready`
/// came (the ready travels through the coordinator, the bytes do not).
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    landed: Landed,
    /// Forgotten after this: no ready that late is for these bytes.
    until: Instant,
}

impl Record for Arrival {
    fn key_hash(&self, key: &HashKey) -> u64 {
        tag_hash(key, self.landed.low16())
    }

    fn due(&self) -> Option<Instant> {
        Some(self.until)
    }
}

/// The arrivals no transfer claimed yet, in a table of fixed size, found
/// by their tag's low bits and forgotten soonest-due first.
#[derive(Debug)]
pub(super) struct Arrivals<'s> {
    table: Table<'s, Arrival>,
}

impl<'s> Arrivals<'s> {
    pub(super) fn new(places: TableStorage<'s, Arrival>, key: HashKey) -> Self {
        Self {
            table: Table::new(places, key, true),
        }
    }

    /// Places the index read so far.
    pub(super) fn probes(&self) -> u64 {
        self.table.probes()
    }

    /// Remembers `landed` until `until`: in a free place, or in that of
    /// the one due to be forgotten soonest. False if a remembered one had
    /// to make room before its time (its transfer, should its ready still
    /// come, then fails as never landed), or if there was no room at all.
    fn keep(&mut self, now: Instant, landed: Landed, until: Instant) -> bool {
        let mut kept = true;
        if self.table.is_full() {
            if let Some((at, i)) = self.table.next_due() {
                kept = at <= now;
                self.table.remove(i);
            }
        }
        self.table.insert(Arrival { landed, until }).is_ok() && kept
    }

    /// Takes the remembered arrival of the write tagged `tag`, if one is
    /// remembered and not yet forgotten.
    pub(super) fn take(&mut self, now: Instant, tag: WriteTag) -> bool {
        let wide = tag_hash(self.table.key(), Landed::of(tag).low16());
        let narrow = tag_hash(self.table.key(), None);
        let names = |a: &Arrival| a.landed.matches(tag) && a.until > now;
        let found = self
            .table
            .find(wide, names)
            .or_else(|| self.table.find(narrow, names));
        found.and_then(|i| self.table.remove(i)).is_some()
    }
}

impl<'s> Instance<'s> {
    /// The data plane reports that a write landed in this instance's pool
    /// ([`Transport::poll_landed`](crate::transport::Transport::poll_landed)):
    /// the transfer waiting for it is handed to the application
    /// ([`InstanceEvent::Received`]), and true returned. A write whose
    /// `transfer_ready` has not come yet is remembered for it (for the
    /// landing limit), and false returned. Only where
    /// [`InstanceIdentity::delivery_complete`] is false; elsewhere reports are ignored.
    pub fn handle_landed(&mut self, now: Instant, landed: Landed) -> bool {
        let Some(limit) = self.landing else {
            return false;
        };
        let Some(index) = self.transfers.landing_of(landed) else {
            if !self.transfers.arrivals.keep(now, landed, now + limit) {
                self.stats.arrivals_dropped += 1;
            }
            return false;
        };
        let Some(r) = self.transfers.requests.remove(index) else {
            return false;
        };
        let Kind::Landing { held, .. } = r.kind else {
            self.transfers.requests.put(index, r);
            return false;
        };
        let token = Token { index, seq: r.seq };
        self.transfers.requests.put(
            index,
            Request {
                kind: Kind::Delivered {
                    held,
                    aborted: false,
                },
                deadline: None,
                ..r
            },
        );
        self.stats.received += 1;
        self.event(InstanceEvent::Received(token));
        true
    }

    /// Transfers waiting for the data plane to report their write landed.
    pub fn awaiting_landing(&self) -> usize {
        self.transfers.requests.tally(CLASS_LANDING)
    }
}
