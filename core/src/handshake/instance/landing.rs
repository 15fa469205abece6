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

/// The arrivals no transfer claimed yet, in a table of fixed size.
#[derive(Debug)]
pub(super) struct Arrivals<'s> {
    places: ManagedSlice<'s, Option<Arrival>>,
}

impl<'s> Arrivals<'s> {
    pub(super) fn new(mut places: ManagedSlice<'s, Option<Arrival>>) -> Self {
        places.iter_mut().for_each(|a| *a = None);
        Self { places }
    }

    /// Remembers `landed` until `until`: in a free (or forgotten) place,
    /// else in the place of the one due to be forgotten soonest. False if
    /// one had to make room so (its transfer, should its ready still come,
    /// then fails as never landed).
    fn keep(&mut self, now: Instant, landed: Landed, until: Instant) -> bool {
        let arrival = Some(Arrival { landed, until });
        let free = self
            .places
            .iter()
            .position(|a| a.is_none_or(|a| a.until <= now));
        if let Some(i) = free {
            self.places[i] = arrival;
            return true;
        }
        let soonest = self
            .places
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.map(|a| (a.until, i)))
            .min();
        if let Some((_, i)) = soonest {
            self.places[i] = arrival;
        }
        false
    }

    /// Takes the remembered arrival of the write tagged `tag`, if one is
    /// remembered and not yet forgotten.
    pub(super) fn take(&mut self, now: Instant, tag: WriteTag) -> bool {
        let found = self
            .places
            .iter()
            .position(|a| a.is_some_and(|a| a.until > now && a.landed.matches(tag)));
        if let Some(i) = found {
            self.places[i] = None;
        }
        found.is_some()
    }
}

impl<'s> Instance<'s> {
    /// The data plane reports that a write landed in this instance's pool
    /// ([`Transport::poll_landed`](crate::transport::Transport::poll_landed)):
    /// the transfer waiting for it is handed to the application
    /// ([`InstanceEvent::Received`]), and true returned. A write whose
    /// `transfer_ready` has not come yet is remembered for it (for the
    /// landing limit), and false returned. Only where
    /// [`InstanceConfig::landing`] is set; elsewhere reports are ignored.
    pub fn handle_landed(&mut self, now: Instant, landed: Landed) -> bool {
        let Some(limit) = self.config.landing else {
            return false;
        };
        let waiting = self.requests.iter().position(
            |r| matches!(r, Some(Request { kind: Kind::Landing { tag, .. }, .. }) if landed.matches(*tag)),
        );
        let Some(index) = waiting else {
            if !self.arrivals.keep(now, landed, now + limit) {
                self.stats.arrivals_dropped += 1;
            }
            return false;
        };
        let Some(r) = self.requests[index].take() else {
            return false;
        };
        let Kind::Landing { held, .. } = r.kind else {
            self.requests[index] = Some(r);
            return false;
        };
        let token = Token { index, seq: r.seq };
        self.requests[index] = Some(Request {
            kind: Kind::Delivered {
                held,
                aborted: false,
            },
            deadline: None,
            ..r
        });
        self.stats.received += 1;
        self.event(InstanceEvent::Received(token));
        true
    }

    /// Transfers waiting for the data plane to report their write landed.
    pub fn awaiting_landing(&self) -> usize {
        self.requests
            .iter()
            .flatten()
            .filter(|r| matches!(r.kind, Kind::Landing { .. }))
            .count()
    }
}
