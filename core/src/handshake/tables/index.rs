//! An open-addressing index from a key's hash to positions in a table, in
//! storage of fixed size.
//!
//! Linear probing, at most half full, with every probe sequence bounded by
//! [`MAX_PROBE`]: an insert takes the first free place within that many of
//! the key's home and fails past it, so a lookup never reads more than
//! `MAX_PROBE` places whatever the keys. Removal moves later entries of
//! the run back (Knuth's algorithm R, in a bounded walk that leaves a
//! marker where it stops early), so lookups of absent keys stop at the
//! first empty place. The keys
//! themselves stay in the table: the index keeps 32 bits of each hash (to
//! skip most non-matches) and the position, and the caller says whether the
//! record at a position is the one it looks for.

use core::cell::Cell;

use crate::managed::ManagedSlice;

/// The longest probe sequence: places an insert may look at from its home,
/// and so the most a lookup reads.
pub const MAX_PROBE: usize = 32;

const EMPTY: u64 = 0;
const GONE: u64 = 1;

/// No place within [`MAX_PROBE`] of the key's home was free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Crowded;

/// Hash → positions, for one table.
#[derive(Debug)]
pub(crate) struct Index<'s> {
    places: ManagedSlice<'s, u64>,
    mask: usize,
    /// Places read by lookups, inserts and removals: the work done.
    probes: Cell<u64>,
}

impl<'s> Index<'s> {
    /// Places an index needs for a table of `entries`: a power of two at
    /// least twice as large, so that it is never more than half full.
    pub(crate) fn places_for(entries: usize) -> usize {
        entries
            .saturating_mul(2)
            .max(MAX_PROBE)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
    }

    /// An empty index over `places` (the largest power of two of them that
    /// it holds is used).
    pub(crate) fn new(places: ManagedSlice<'s, u64>) -> Self {
        let n = match places.len() {
            0 => 0,
            // At most 2^31 places: a position's home is 32 bits of its hash.
            n => 1usize << (usize::BITS - 1 - n.leading_zeros()).min(31),
        };
        let mut places = places.truncated(n);
        places.iter_mut().for_each(|p| *p = EMPTY);
        Self {
            places,
            mask: n.wrapping_sub(1),
            probes: Cell::new(0),
        }
    }

    /// Places read so far.
    pub(crate) fn probes(&self) -> u64 {
        self.probes.get()
    }

    fn tag(hash: u64) -> u64 {
        hash >> 32
    }

    fn home(&self, hash: u64) -> usize {
        (Self::tag(hash) as usize) & self.mask
    }

    fn probe_window(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let home = self.home(hash);
        let len = self.places.len().min(MAX_PROBE);
        (0..len).map(move |d| (home + d) & self.mask)
    }

    fn count(&self, n: usize) {
        self.probes.set(self.probes.get().wrapping_add(n as u64));
    }

    /// Indexes `pos` under `hash`. Entries of equal hashes may coexist (a
    /// request id names a record per leg).
    pub(crate) fn insert(&mut self, hash: u64, pos: usize) -> Result<(), Crowded> {
        let Some(pos) = u32::try_from(pos).ok().filter(|&p| p <= u32::MAX - 2) else {
            return Err(Crowded);
        };
        let entry = (Self::tag(hash) << 32) | (u64::from(pos) + 2);
        let mut read = 0;
        let mut found = None;
        for i in self.probe_window(hash) {
            read += 1;
            if self.places[i] <= GONE {
                found = Some(i);
                break;
            }
        }
        self.count(read);
        let i = found.ok_or(Crowded)?;
        self.places[i] = entry;
        Ok(())
    }

    /// The first position indexed under `hash` that `is` accepts.
    pub(crate) fn find(&self, hash: u64, mut is: impl FnMut(usize) -> bool) -> Option<usize> {
        let tag = Self::tag(hash);
        let mut read = 0;
        let mut found = None;
        for i in self.probe_window(hash) {
            read += 1;
            let e = self.places[i];
            if e == EMPTY {
                break;
            }
            if e != GONE && e >> 32 == tag {
                let pos = (e & 0xffff_ffff) as usize - 2;
                if is(pos) {
                    found = Some(pos);
                    break;
                }
            }
        }
        self.count(read);
        found
    }

    /// Removes the entry of `pos` under `hash`; false if there was none.
    pub(crate) fn remove(&mut self, hash: u64, pos: usize) -> bool {
        let Ok(pos) = u32::try_from(pos) else {
            return false;
        };
        let entry = (Self::tag(hash) << 32) | (u64::from(pos) + 2);
        let mut read = 0;
        let mut at = None;
        for i in self.probe_window(hash) {
            read += 1;
            match self.places[i] {
                EMPTY => break,
                e if e == entry => {
                    at = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(mut hole) = at else {
            self.count(read);
            return false;
        };
        // Knuth's algorithm R: entries after the hole whose home lies at or
        // before it move back into it, so that no marker is left and lookups
        // of absent keys stop at the first empty place. The walk is bounded;
        // where it stops early the hole stays a marker, which is as correct.
        self.places[hole] = EMPTY;
        let mut j = hole;
        let mut steps = 0;
        loop {
            j = (j + 1) & self.mask;
            steps += 1;
            read += 1;
            if steps > 4 * MAX_PROBE {
                self.places[hole] = GONE;
                break;
            }
            let e = self.places[j];
            if e == EMPTY {
                break;
            }
            if e == GONE {
                continue;
            }
            let home = (e >> 32) as usize & self.mask;
            let from_home = j.wrapping_sub(home) & self.mask;
            let from_hole = j.wrapping_sub(hole) & self.mask;
            if from_home >= from_hole {
                self.places[hole] = e;
                self.places[j] = EMPTY;
                hole = j;
            }
        }
        self.count(read);
        true
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;

    fn index(n: usize) -> Index<'static> {
        Index::new(crate::managed::filled(Index::places_for(n), 0))
    }

    #[test]
    fn finds_what_it_holds_and_forgets_what_is_removed() {
        let mut ix = index(64);
        for pos in 0..64 {
            ix.insert((pos as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15), pos)
                .unwrap();
        }
        for pos in 0..64 {
            let h = (pos as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            assert_eq!(ix.find(h, |p| p == pos), Some(pos));
        }
        for pos in (0..64).step_by(2) {
            assert!(ix.remove((pos as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15), pos));
        }
        for pos in 0..64 {
            let h = (pos as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let want = (pos % 2 == 1).then_some(pos);
            assert_eq!(ix.find(h, |p| p == pos), want);
        }
    }

    #[test]
    fn one_hash_holds_many_positions_up_to_the_probe_bound() {
        let mut ix = index(1024);
        let h = 42u64 << 32;
        for pos in 0..MAX_PROBE {
            ix.insert(h, pos).unwrap();
        }
        assert_eq!(ix.insert(h, 999), Err(Crowded));
        let before = ix.probes();
        assert_eq!(ix.find(h, |p| p == 7), Some(7));
        assert_eq!(ix.find(h, |_| false), None);
        assert!(ix.probes() - before <= 2 * MAX_PROBE as u64);
        assert!(ix.remove(h, 3));
        ix.insert(h, 999).unwrap();
        assert_eq!(ix.find(h, |p| p == 999), Some(999));
    }

    #[test]
    fn churn_keeps_every_live_entry_findable() {
        // A model check: random inserts and removals against a list.
        let mut ix = index(256);
        let mut live: alloc::vec::Vec<(u64, usize)> = alloc::vec::Vec::new();
        let mut x = 0x1234_5678_9abc_def0u64;
        for step in 0..20_000usize {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if live.len() < 256 && (x & 1 == 0 || live.is_empty()) {
                // Few distinct homes, so runs meet and markers pile up.
                let h = (x % 97) << 32 | (x >> 40);
                if ix.insert(h, step).is_ok() {
                    live.push((h, step));
                }
            } else {
                let (h, pos) = live.swap_remove((x as usize >> 3) % live.len());
                assert!(ix.remove(h, pos));
            }
            if step % 97 == 0 {
                for &(h, pos) in &live {
                    assert_eq!(ix.find(h, |p| p == pos), Some(pos), "step {step}");
                }
            }
        }
    }
}
