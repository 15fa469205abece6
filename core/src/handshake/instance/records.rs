//! The bookkeeping under every message that spans the instance's parts:
//! queuing what goes out (nothing once it left; a full queue is counted),
//! and quarantining a slot for the configured time.

use super::*;

impl<'s> Instance<'s> {
    pub(super) fn send(&mut self, m: OutMsg) {
        if self.standing.left {
            // `leave` said all there is to say.
            return;
        }
        if !self.outbox.send(m) {
            self.stats.dropped += 1;
        }
    }

    pub(super) fn event(&mut self, e: InstanceEvent) {
        if !self.outbox.event(e) {
            self.stats.dropped += 1;
        }
    }

    /// Quarantines request `index`'s slot for the configured time from
    /// `now` (see [`Transfers::quarantine`]).
    pub(super) fn sit_out(
        &mut self,
        index: usize,
        request: (RequestId, u64),
        held: Held,
        now: Instant,
        report: Option<&'static str>,
    ) {
        let until = now + self.config.quarantine;
        self.transfers
            .quarantine(index, request, held, until, report);
    }
}
