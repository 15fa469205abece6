//! What is due on the world's clock: by time, then in the order it was
//! scheduled (so that a run replays exactly).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Events by time (nanoseconds of the virtual clock), then by order.
pub(crate) struct Queue<T> {
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    items: Vec<Option<T>>,
    seq: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            items: Vec::new(),
            seq: 0,
        }
    }
}

impl<T> Queue<T> {
    pub(crate) fn push(&mut self, at: u64, item: T) {
        self.seq += 1;
        self.items.push(Some(item));
        self.heap
            .push(Reverse((at, self.seq, self.items.len() - 1)));
    }

    /// When the next item is due.
    pub(crate) fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next item and its time.
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
        let Reverse((at, _, idx)) = self.heap.pop()?;
        let item = self.items[idx].take()?;
        Some((at, item))
    }
}
