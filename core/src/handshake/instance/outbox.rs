//! What the instance has for its caller: messages for the coordinator,
//! writes to post and events for the application, each in a queue of its
//! own that the caller polls.

use super::*;

/// The three queues.
#[derive(Debug)]
pub(super) struct Outbox<'s> {
    /// Messages for the coordinator, encoded when polled.
    pub(super) transmits: Ring<'s, Outgoing>,
    /// Writes to post.
    pub(super) actions: Ring<'s, Write>,
    /// Events for the application.
    pub(super) events: Ring<'s, InstanceEvent>,
}

/// The outbox's storage.
pub struct OutboxStorage<'s> {
    /// Messages not yet polled.
    pub transmits: ManagedSlice<'s, Option<Outgoing>>,
    /// Writes not yet polled.
    pub actions: ManagedSlice<'s, Option<Write>>,
    /// Events not yet polled.
    pub events: ManagedSlice<'s, Option<InstanceEvent>>,
}

/// The lengths of an [`OutboxStorage`]'s slices
/// ([`OutboxStorage::storage_needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxSizes {
    /// `transmits`.
    pub transmits: usize,
    /// `actions`.
    pub actions: usize,
    /// `events`.
    pub events: usize,
}

impl OutboxStorage<'_> {
    /// Queues that are never full for `limits.requests` in flight: per
    /// request at most a few messages and events are queued at once
    /// (staged, allocated or reject, pushed, done), and one write.
    pub fn storage_needed(limits: &Limits) -> OutboxSizes {
        let n = limits.requests.max(1);
        OutboxSizes {
            transmits: 4 * n + 8,
            actions: n,
            events: 4 * n + 8,
        }
    }

    /// The lengths given.
    pub fn sizes(&self) -> OutboxSizes {
        OutboxSizes {
            transmits: self.transmits.len(),
            actions: self.actions.len(),
            events: self.events.len(),
        }
    }

    /// Refuses lengths other than `needed`, naming the first that is.
    pub fn check(&self, needed: &OutboxSizes) -> Result<(), StorageError> {
        let given = self.sizes();
        StorageError::check_each(
            "outbox",
            [
                ("transmits", needed.transmits, given.transmits),
                ("actions", needed.actions, given.actions),
                ("events", needed.events, given.events),
            ],
        )
    }
}

#[cfg(feature = "alloc")]
impl OutboxStorage<'static> {
    /// Queues of its own, as long as `sizes` says.
    pub fn owned(sizes: &OutboxSizes) -> Self {
        use crate::managed::empty;
        Self {
            transmits: empty(sizes.transmits),
            actions: empty(sizes.actions),
            events: empty(sizes.events),
        }
    }
}

impl<'s> Outbox<'s> {
    pub(super) fn new(s: OutboxStorage<'s>) -> Self {
        Self {
            transmits: Ring::new(s.transmits),
            actions: Ring::new(s.actions),
            events: Ring::new(s.events),
        }
    }

    /// Queues a message; false if its queue is full.
    pub(super) fn send(&mut self, m: OutMsg) -> bool {
        self.transmits.push(Outgoing(m)).is_ok()
    }

    /// Queues an event; false if its queue is full.
    pub(super) fn event(&mut self, e: InstanceEvent) -> bool {
        self.events.push(e).is_ok()
    }

    /// Queues a write; false if its queue is full.
    pub(super) fn write(&mut self, w: Write) -> bool {
        self.actions.push(w).is_ok()
    }

    /// Drops the messages queued for a coordinator that was lost.
    pub(super) fn forget_transmits(&mut self) {
        while self.transmits.pop().is_some() {}
    }
}
