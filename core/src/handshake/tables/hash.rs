//! The keyed hash the machines' indexes are built on.
//!
//! Request ids, session names and endpoints come from peers, so an index
//! keyed by a hash everyone can compute could be flooded with ids chosen
//! to collide. The hash is SipHash-1-3 (what std's `HashMap` uses against
//! exactly that) under a key of the machine's own: without the key, a peer
//! cannot aim at a bucket. The indexes also bound every probe sequence
//! ([`MAX_PROBE`](super::index::MAX_PROBE)), so even a peer that knew the
//! key could not make a lookup scan.

use core::fmt;
use core::hash::Hasher;

use siphasher::sip::SipHasher13;

use crate::json::JsonStr;

/// The secret key of a state machine's hash indexes.
///
/// Tables sized by [`Limits`](crate::handshake::Limits) get a fresh random
/// key from the process's random source with the `std` feature
/// (`HashKey::random`); without it they get [`HashKey::FIXED`], and a
/// caller that has a source of randomness should put its own key in the
/// storage before building the machine. The key decides nothing but where
/// records sit in the indexes: a machine behaves the same under any key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HashKey([u64; 2]);

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A secret: its value helps nobody reading a log.
        f.write_str("HashKey(..)")
    }
}

impl Default for HashKey {
    fn default() -> Self {
        Self::FIXED
    }
}

impl HashKey {
    /// A key everyone knows: reproducible runs (tests, simulations) and
    /// builds without a source of randomness.
    pub const FIXED: Self = Self([0x6665_7272_795f_6b30, 0x6665_7272_795f_6b31]);

    /// The key `k0`, `k1` (for example 16 bytes from the OS's random
    /// source).
    pub const fn new(k0: u64, k1: u64) -> Self {
        Self([k0, k1])
    }

    /// A key drawn from std's per-process random source (the one that
    /// keys `HashMap`s).
    #[cfg(feature = "std")]
    pub fn random() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let s = RandomState::new();
        Self([s.hash_one(0x6b30_u64), s.hash_one(0x6b31_u64)])
    }

    /// The hash of `bytes` in namespace `ns` (which table or leg it keys).
    pub(crate) fn bytes(&self, bytes: &[u8], ns: u64) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.0[0], self.0[1]);
        h.write(bytes);
        h.write_u64(ns);
        h.finish()
    }

    /// The hash of a number in namespace `ns`.
    pub(crate) fn number(&self, n: u64, ns: u64) -> u64 {
        self.bytes(&n.to_le_bytes(), ns)
    }

    /// The hash of `s` as decoded (escaped and plain spellings of one
    /// string hash alike), or `None` if it decodes to more than `N` bytes:
    /// no table keeps such a string, so it is found nowhere.
    pub(crate) fn json<const N: usize>(&self, s: JsonStr<'_>, ns: u64) -> Option<u64> {
        if let Some(plain) = s.as_plain() {
            return (plain.len() <= N).then(|| self.bytes(plain.as_bytes(), ns));
        }
        let mut buf = [0u8; N];
        let text = s.unescape_into(&mut buf).ok()?;
        Some(self.bytes(text.as_bytes(), ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_and_plain_spellings_hash_alike() {
        let k = HashKey::new(1, 2);
        let plain = k.json::<64>(JsonStr::plain("ré"), 7);
        let escaped = JsonStr::from_validated(r"r\u00e9", true);
        assert!(plain.is_some());
        assert_eq!(k.json::<64>(escaped, 7), plain);
        assert_ne!(k.json::<64>(JsonStr::plain("ré"), 8), plain);
        assert_eq!(k.json::<1>(JsonStr::plain("ré"), 7), None);
    }

    #[test]
    fn the_key_changes_every_hash() {
        let (a, b) = (HashKey::new(1, 2), HashKey::new(1, 3));
        assert_ne!(a.bytes(b"req-1", 0), b.bytes(b"req-1", 0));
    }
}
