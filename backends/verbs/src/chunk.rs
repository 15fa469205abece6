//! Splitting writes into work requests, and the send-queue window.
//!
//! A write larger than the port's maximum message becomes several RDMA
//! WRITEs. Only the last chunk of a write asks for a completion: RC
//! completes in order, so its completion covers every chunk before it. A
//! send queue slot is freed only by a completion, though, so a long run of
//! unsignaled chunks is broken by a signaled one every half window; the
//! window itself bounds how many work requests are outstanding.

/// The chunk of a write that starts `done` bytes in: its length.
pub fn chunk_len(total: u64, done: u64, max_msg: u32) -> u32 {
    let left = total.saturating_sub(done);
    // Fits: bounded by max_msg, a u32.
    left.min(u64::from(max_msg.max(1))) as u32
}

/// How many chunks a write of `total` bytes takes (a zero-byte write still
/// takes one work request, which completes without moving data).
pub fn chunk_count(total: u64, max_msg: u32) -> u64 {
    total.div_ceil(u64::from(max_msg.max(1))).max(1)
}

/// The outstanding work requests of one queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    depth: u32,
    in_flight: u32,
    unsignaled: u32,
}

impl Window {
    /// A window of `depth` work requests (at least 2).
    pub fn new(depth: u32) -> Self {
        Self {
            depth: depth.max(2),
            in_flight: 0,
            unsignaled: 0,
        }
    }

    /// True if another work request may be posted.
    pub fn has_room(&self) -> bool {
        self.in_flight < self.depth
    }

    /// Work requests posted and not yet covered by a completion.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Takes a slot for a work request; returns `Some(covered)` if it is
    /// signaled (its completion frees `covered` slots: itself and the
    /// unsignaled ones before it), `None` if it goes unsignaled. `signal`
    /// asks for a completion (the last chunk of a write); every half
    /// window gets one regardless.
    pub fn take(&mut self, signal: bool) -> Option<u32> {
        self.in_flight += 1;
        self.unsignaled += 1;
        if signal || self.unsignaled >= self.depth / 2 {
            let covered = self.unsignaled;
            self.unsignaled = 0;
            Some(covered)
        } else {
            None
        }
    }

    /// A signaled completion arrived that covers `covered` slots.
    pub fn complete(&mut self, covered: u32) {
        self.in_flight = self.in_flight.saturating_sub(covered);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_split_at_the_maximum_message() {
        assert_eq!(chunk_count(0, 1024), 1);
        assert_eq!(chunk_count(1, 1024), 1);
        assert_eq!(chunk_count(1024, 1024), 1);
        assert_eq!(chunk_count(1025, 1024), 2);
        assert_eq!(chunk_count(1 << 30, 1 << 30), 1);
        assert_eq!(chunk_count(u64::from(u32::MAX) * 3, u32::MAX), 3);
        let mut done = 0;
        let mut lens = vec![];
        while done < 2500 {
            let n = chunk_len(2500, done, 1024);
            lens.push(n);
            done += u64::from(n);
        }
        assert_eq!(lens, [1024, 1024, 452]);
        assert_eq!(chunk_len(10, 10, 1024), 0);
        assert_eq!(chunk_len(10, 0, 0), 1, "a zero maximum is treated as 1");
    }

    #[test]
    fn only_the_last_chunk_or_a_half_window_is_signaled() {
        let mut w = Window::new(8);
        // A 3-chunk write: the third is signaled and covers all three.
        assert_eq!(w.take(false), None);
        assert_eq!(w.take(false), None);
        assert_eq!(w.take(true), Some(3));
        assert_eq!(w.in_flight(), 3);
        // A long write: every 4th (half of 8) is signaled.
        assert_eq!(w.take(false), None);
        assert_eq!(w.take(false), None);
        assert_eq!(w.take(false), None);
        assert_eq!(w.take(false), Some(4));
        assert_eq!(w.in_flight(), 7);
        assert!(w.has_room());
        assert_eq!(w.take(false), None);
        assert!(!w.has_room(), "8 outstanding fill the window");
        w.complete(3);
        assert!(w.has_room());
        w.complete(4);
        assert_eq!(w.in_flight(), 1);
        w.complete(10);
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn the_window_never_fills_with_unsignaled_requests() {
        // Whatever the depth, a full window always holds a signaled request
        // whose completion frees room.
        for depth in 2..64 {
            let mut w = Window::new(depth);
            let mut since_signal = 0;
            while w.has_room() {
                since_signal = match w.take(false) {
                    Some(_) => 0,
                    None => since_signal + 1,
                };
            }
            assert!(since_signal < depth, "depth {depth}");
        }
    }
}
