//! What the coordinator has for its caller: messages for its peers and
//! events for the application, each in a queue of its own that the caller
//! polls.

use super::*;

/// The two queues.
#[derive(Debug)]
pub(super) struct Outbox<'s> {
    /// Messages for peers, encoded when polled.
    pub(super) transmits: Ring<'s, Outgoing>,
    /// Events for the application.
    pub(super) events: Ring<'s, CoordinatorEvent>,
}

/// The outbox's storage.
pub struct OutboxStorage<'s> {
    /// Messages not yet polled.
    pub transmits: ManagedSlice<'s, Option<Outgoing>>,
    /// Events not yet polled.
    pub events: ManagedSlice<'s, Option<CoordinatorEvent>>,
}

/// The lengths of an [`OutboxStorage`]'s slices
/// ([`OutboxStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxSizes {
    /// `transmits`.
    pub transmits: usize,
    /// `events`.
    pub events: usize,
}

impl OutboxStorage<'_> {
    /// Queues that are never full for `limits`: two messages per transfer
    /// plus one per member, and as many events.
    pub fn storage_needed(limits: &Limits) -> OutboxSizes {
        let queue = 2 * limits.requests.max(1) + limits.members.max(1) + 8;
        OutboxSizes {
            transmits: queue,
            events: queue,
        }
    }

    /// Refuses lengths other than `needed`, naming the first that is.
    pub fn check(&self, needed: &OutboxSizes) -> Result<(), StorageError> {
        StorageError::check_each(
            "outbox",
            [
                ("transmits", needed.transmits, self.transmits.len()),
                ("events", needed.events, self.events.len()),
            ],
        )
    }
}

#[cfg(feature = "alloc")]
impl OutboxStorage<'static> {
    /// Queues of their own, as long as `sizes` says.
    pub fn owned(sizes: &OutboxSizes) -> Self {
        use crate::managed::empty;
        Self {
            transmits: empty(sizes.transmits),
            events: empty(sizes.events),
        }
    }
}

impl<'s> Outbox<'s> {
    pub(super) fn new(s: OutboxStorage<'s>) -> Self {
        Self {
            transmits: Ring::new(s.transmits),
            events: Ring::new(s.events),
        }
    }
}
