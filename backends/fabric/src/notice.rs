//! Arrival notices: the remote CQ data each chunk of a write carries, and
//! the receiver's count of them.
//!
//! Where the provider cannot say that a write reached the target
//! (`tcp;ofi_rxm` reports a write complete once it is handed to the
//! socket), the receiver must not trust `transfer_ready` alone. Every chunk
//! of a write is posted with remote CQ data naming the write (its
//! [`WriteTag`]) and how many chunks it has; the receiver counts them and
//! takes the transfer only when all have arrived.
//!
//! The data is the tag's low bits and the chunk count: 40 + 24 bits where
//! the provider carries 8 bytes, 20 + 12 where it carries 4 (EFA, verbs).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ferry_core::transport::WriteTag;

/// How a notice is packed into remote CQ data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticeFormat {
    count_bits: u32,
    tag_bits: u32,
}

impl NoticeFormat {
    /// For 8-byte CQ data (`wide`) or 4-byte.
    pub const fn new(wide: bool) -> Self {
        if wide {
            Self {
                count_bits: 24,
                tag_bits: 40,
            }
        } else {
            Self {
                count_bits: 12,
                tag_bits: 20,
            }
        }
    }

    /// Most chunks one write may have.
    pub const fn max_chunks(self) -> u64 {
        (1 << self.count_bits) - 1
    }

    /// The data for each chunk of a write tagged `tag` in `chunks` chunks.
    pub fn encode(self, tag: WriteTag, chunks: u64) -> u64 {
        debug_assert!(chunks >= 1 && chunks <= self.max_chunks());
        (self.tag_of(tag) << self.count_bits) | (chunks & self.max_chunks())
    }

    /// The tag bits and the chunk count of received data.
    pub fn decode(self, data: u64) -> (u64, u64) {
        (
            (data >> self.count_bits) & ((1 << self.tag_bits) - 1),
            data & self.max_chunks(),
        )
    }

    /// The bits of `tag` a notice carries.
    pub fn tag_of(self, tag: WriteTag) -> u64 {
        tag.0 & ((1 << self.tag_bits) - 1)
    }
}

#[derive(Clone, Copy, Debug)]
struct Landing {
    seen: u64,
    expected: u64,
    first: Instant,
}

/// The receiver's count of notices, by tag.
#[derive(Debug)]
pub struct NoticeBook {
    format: NoticeFormat,
    landings: HashMap<u64, Landing>,
    /// Counts that were never claimed (the transfer was aborted after its
    /// write) are dropped after this long.
    max_age: Duration,
    /// Most counts kept; the oldest go first beyond it.
    cap: usize,
}

impl NoticeBook {
    /// An empty book.
    pub fn new(format: NoticeFormat, max_age: Duration, cap: usize) -> Self {
        Self {
            format,
            landings: HashMap::with_capacity(cap.min(4096)),
            max_age,
            cap: cap.max(1),
        }
    }

    /// Counts one received notice.
    pub fn record(&mut self, data: u64, now: Instant) {
        let (tag, expected) = self.format.decode(data);
        if self.landings.len() >= self.cap && !self.landings.contains_key(&tag) {
            self.prune(now);
            if self.landings.len() >= self.cap {
                if let Some(oldest) = self
                    .landings
                    .iter()
                    .min_by_key(|(_, l)| l.first)
                    .map(|(t, _)| *t)
                {
                    self.landings.remove(&oldest);
                }
            }
        }
        let l = self.landings.entry(tag).or_insert(Landing {
            seen: 0,
            expected,
            first: now,
        });
        l.seen += 1;
        l.expected = expected;
    }

    /// True once every chunk of the write tagged `tag` arrived; the count
    /// is then consumed.
    pub fn take(&mut self, tag: WriteTag) -> bool {
        let key = self.format.tag_of(tag);
        match self.landings.get(&key) {
            Some(l) if l.seen >= l.expected => {
                self.landings.remove(&key);
                true
            }
            _ => false,
        }
    }

    /// Drops counts older than the maximum age.
    pub fn prune(&mut self, now: Instant) {
        let max_age = self.max_age;
        self.landings
            .retain(|_, l| now.saturating_duration_since(l.first) < max_age);
    }

    /// Counts held.
    pub fn len(&self) -> usize {
        self.landings.len()
    }

    /// True if no count is held.
    pub fn is_empty(&self) -> bool {
        self.landings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_pack_tag_and_count_in_both_widths() {
        for wide in [true, false] {
            let f = NoticeFormat::new(wide);
            let tag = WriteTag::of("req-7", 0x7f00_0010_0000);
            for chunks in [1, 2, f.max_chunks()] {
                let data = f.encode(tag, chunks);
                if !wide {
                    assert!(data <= u64::from(u32::MAX), "fits 4 bytes");
                }
                assert_eq!(f.decode(data), (f.tag_of(tag), chunks));
            }
        }
        assert_eq!(NoticeFormat::new(true).max_chunks(), (1 << 24) - 1);
        assert_eq!(NoticeFormat::new(false).max_chunks(), 4095);
    }

    #[test]
    fn a_write_lands_when_all_its_chunks_arrived() {
        let f = NoticeFormat::new(true);
        let mut book = NoticeBook::new(f, Duration::from_secs(60), 64);
        let now = Instant::now();
        let a = WriteTag::of("a", 4096);
        let b = WriteTag::of("b", 4096);
        assert!(!book.take(a));
        book.record(f.encode(a, 3), now);
        book.record(f.encode(b, 1), now);
        book.record(f.encode(a, 3), now);
        assert!(!book.take(a), "2 of 3 chunks");
        assert!(book.take(b));
        assert!(!book.take(b), "a count is consumed once");
        book.record(f.encode(a, 3), now);
        assert!(book.take(a));
        assert!(book.is_empty());
    }

    #[test]
    fn unclaimed_counts_age_out_and_the_book_stays_bounded() {
        let f = NoticeFormat::new(false);
        let mut book = NoticeBook::new(f, Duration::from_secs(1), 4);
        let t0 = Instant::now();
        for i in 0..4 {
            book.record(f.encode(WriteTag::of("r", i * 4096), 2), t0);
        }
        assert_eq!(book.len(), 4);
        book.record(
            f.encode(WriteTag::of("late", 0), 1),
            t0 + Duration::from_millis(10),
        );
        assert_eq!(book.len(), 4, "the oldest went to make room");
        assert!(book.take(WriteTag::of("late", 0)));
        book.prune(t0 + Duration::from_secs(2));
        assert!(book.is_empty());
    }

    #[test]
    fn tags_differ_by_request_and_by_destination() {
        let a = WriteTag::of("req-1", 0x1000);
        assert_ne!(a, WriteTag::of("req-2", 0x1000));
        assert_ne!(a, WriteTag::of("req-1", 0x2000));
        assert_eq!(a, WriteTag::of("req-1", 0x1000));
    }
}
