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

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{Landed, WriteTag};

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
struct Count {
    seen: u64,
    expected: u64,
    first: Instant,
}

/// The receiver's count of notices, by tag, and the writes whose every
/// chunk arrived, in the order they completed, until they are polled.
#[derive(Debug)]
pub struct NoticeBook {
    format: NoticeFormat,
    counts: HashMap<u64, Count>,
    landed: VecDeque<Landed>,
    /// Counts whose write never completes (a chunk lost with its
    /// connection) are dropped after this long.
    max_age: Duration,
    /// Most counts, and most landed writes, kept; the oldest go first
    /// beyond it.
    cap: usize,
    /// Landed writes dropped unpolled because `cap` were waiting.
    pub dropped: u64,
}

impl NoticeBook {
    /// An empty book.
    pub fn new(format: NoticeFormat, max_age: Duration, cap: usize) -> Self {
        Self {
            format,
            counts: HashMap::with_capacity(cap.min(4096)),
            landed: VecDeque::new(),
            max_age,
            cap: cap.max(1),
            dropped: 0,
        }
    }

    /// Counts one received notice; the write it belongs to is landed once
    /// every chunk's notice came.
    pub fn record(&mut self, data: u64, now: Instant) {
        let (tag, expected) = self.format.decode(data);
        if self.counts.len() >= self.cap && !self.counts.contains_key(&tag) {
            self.prune(now);
            if self.counts.len() >= self.cap {
                if let Some(oldest) = self
                    .counts
                    .iter()
                    .min_by_key(|(_, c)| c.first)
                    .map(|(t, _)| *t)
                {
                    self.counts.remove(&oldest);
                }
            }
        }
        let c = self.counts.entry(tag).or_insert(Count {
            seen: 0,
            expected,
            first: now,
        });
        c.seen += 1;
        c.expected = expected;
        if c.seen >= c.expected {
            self.counts.remove(&tag);
            if self.landed.len() >= self.cap {
                self.landed.pop_front();
                self.dropped += 1;
            }
            self.landed
                .push_back(Landed::low_bits(tag, self.format.tag_bits));
        }
    }

    /// The next write whose every chunk arrived, each once.
    pub fn pop_landed(&mut self) -> Option<Landed> {
        self.landed.pop_front()
    }

    /// Drops counts older than the maximum age.
    pub fn prune(&mut self, now: Instant) {
        let max_age = self.max_age;
        self.counts
            .retain(|_, c| now.saturating_duration_since(c.first) < max_age);
    }

    /// Writes counted and not yet landed.
    pub fn counting(&self) -> usize {
        self.counts.len()
    }

    /// Landed writes not yet polled.
    pub fn waiting(&self) -> usize {
        self.landed.len()
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
        assert_eq!(book.pop_landed(), None);
        book.record(f.encode(a, 3), now);
        book.record(f.encode(b, 1), now);
        book.record(f.encode(a, 3), now);
        let landed = book.pop_landed().expect("b's one chunk arrived");
        assert!(landed.matches(b) && !landed.matches(a));
        assert_eq!(
            book.pop_landed(),
            None,
            "2 of a's 3 chunks; b reported once"
        );
        book.record(f.encode(a, 3), now);
        assert!(book.pop_landed().is_some_and(|l| l.matches(a)));
        assert_eq!((book.counting(), book.waiting()), (0, 0));
    }

    #[test]
    fn unfinished_counts_age_out_and_the_book_stays_bounded() {
        let f = NoticeFormat::new(false);
        let mut book = NoticeBook::new(f, Duration::from_secs(1), 4);
        let t0 = Instant::now();
        for i in 0..4 {
            book.record(f.encode(WriteTag::of("r", i * 4096), 2), t0);
        }
        assert_eq!(book.counting(), 4);
        book.record(
            f.encode(WriteTag::of("late", 0), 1),
            t0 + Duration::from_millis(10),
        );
        assert_eq!(
            book.counting(),
            3,
            "the oldest went to make room; late landed"
        );
        assert!(book
            .pop_landed()
            .is_some_and(|l| l.matches(WriteTag::of("late", 0))));
        book.prune(t0 + Duration::from_secs(2));
        assert_eq!(book.counting(), 0);
        // Landed writes nobody polls are bounded too: the oldest go.
        for i in 0..6 {
            book.record(f.encode(WriteTag::of("w", i * 4096), 1), t0);
        }
        assert_eq!((book.waiting(), book.dropped), (4, 2));
        assert!(book
            .pop_landed()
            .is_some_and(|l| l.matches(WriteTag::of("w", 2 * 4096))));
    }

    #[test]
    fn tags_differ_by_request_and_by_destination() {
        let a = WriteTag::of("req-1", 0x1000);
        assert_ne!(a, WriteTag::of("req-2", 0x1000));
        assert_ne!(a, WriteTag::of("req-1", 0x2000));
        assert_eq!(a, WriteTag::of("req-1", 0x1000));
    }
}
