//! A FIFO over caller storage, for the messages, actions and events a state
//! machine has produced and the caller has not polled yet.

use crate::managed::ManagedSlice;

/// A bounded FIFO of `T` in a caller-owned slice.
#[derive(Debug)]
pub struct Ring<'s, T> {
    slots: ManagedSlice<'s, Option<T>>,
    head: usize,
    len: usize,
}

impl<'s, T> Ring<'s, T> {
    /// A queue holding at most `slots.len()` items.
    pub fn new(mut slots: ManagedSlice<'s, Option<T>>) -> Self {
        for s in slots.iter_mut() {
            *s = None;
        }
        Self {
            slots,
            head: 0,
            len: 0,
        }
    }

    /// Appends `item`, or hands it back if the queue is full.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        let cap = self.slots.len();
        if self.len == cap {
            return Err(item);
        }
        let i = (self.head + self.len) % cap;
        self.slots[i] = Some(item);
        self.len += 1;
        Ok(())
    }

    /// The oldest item.
    pub fn front(&self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        self.slots[self.head].as_ref()
    }

    /// Removes and returns the oldest item.
    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.slots[self.head].take();
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        if self.len == 0 {
            // Empty again: start over at the front, so that a queue that is
            // mostly empty (the usual case, however large its storage) keeps
            // to a few cache lines instead of streaming through them all.
            self.head = 0;
        }
        item
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free places.
    pub fn free(&self) -> usize {
        self.slots.len() - self.len
    }
}
