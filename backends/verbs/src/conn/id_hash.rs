//! The hasher of the connection book's maps.

/// Hashing for the maps keyed by this book's own counters (write ids,
/// work-request ids, connection ids): nobody outside chooses these keys, so
/// SipHash's defence buys nothing, and a multiply is a tenth of its cost.
#[derive(Clone, Copy, Default)]
pub(super) struct IdHash;

/// The hasher of [`IdHash`].
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // hashbrown takes the bucket from the low bits and a tag from the
        // top 7: a multiply by an odd constant permutes the low bits of
        // sequential ids (no collisions among neighbours) and spreads them
        // into the top ones.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
