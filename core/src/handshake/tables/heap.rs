//! Min-heaps of ids by a 64-bit key, in storage of fixed size, that find
//! and move any id in O(log n): the machines' timers (key: a deadline) and
//! the coordinator's receiver ranking (key: how good a receiver is).
//!
//! One storage holds several heaps ("lanes", one per role for the
//! ranking); an id is in at most one lane at a time.

use crate::handshake::HeapStorage;
use crate::managed::ManagedSlice;

/// The most lanes one storage holds.
pub(crate) const MAX_LANES: usize = 8;

/// A place in a lane: the key, then the id.
pub type HeapEntry = (u64, u32);

/// Heaps of ids `0..ids` by key.
#[derive(Debug)]
pub(crate) struct Heaps<'s> {
    /// Lane `l` is `entries[l * ids..][..lens[l]]`.
    entries: ManagedSlice<'s, HeapEntry>,
    /// Per id: 0 if in no lane, else `lane << 32 | (place + 1)`.
    places: ManagedSlice<'s, u64>,
    ids: usize,
    lens: [usize; MAX_LANES],
}

impl<'s> Heaps<'s> {
    /// Empty lanes for ids below `places.len()`; as many lanes as
    /// `entries` holds `places.len()` entries each, at most [`MAX_LANES`].
    pub(crate) fn new(storage: HeapStorage<'s>) -> Self {
        let HeapStorage {
            entries,
            mut places,
        } = storage;
        places.iter_mut().for_each(|p| *p = 0);
        // Ids beyond one lane's entries could not be placed.
        let ids = places.len().min(entries.len());
        Self {
            entries,
            places,
            ids,
            lens: [0; MAX_LANES],
        }
    }

    fn lanes(&self) -> usize {
        if self.ids == 0 {
            return 0;
        }
        (self.entries.len() / self.ids).min(MAX_LANES)
    }

    /// The key of `id` and its lane, if it is in one.
    pub(crate) fn get(&self, id: usize) -> Option<(u64, usize)> {
        let p = *self.places.get(id)?;
        if p == 0 {
            return None;
        }
        let lane = (p >> 32) as usize;
        let place = (p & 0xffff_ffff) as usize - 1;
        Some((self.entries[lane * self.ids + place].0, lane))
    }

    /// The least key of `lane` and its id.
    pub(crate) fn peek(&self, lane: usize) -> Option<(u64, usize)> {
        if self.lens.get(lane).copied().unwrap_or(0) == 0 {
            return None;
        }
        let (key, id) = self.entries[lane * self.ids];
        Some((key, id as usize))
    }

    /// The entries of `lane`, in no order.
    pub(crate) fn lane(&self, lane: usize) -> &[HeapEntry] {
        let len = self.lens.get(lane).copied().unwrap_or(0);
        &self.entries[lane * self.ids..][..len]
    }

    /// Puts `id` in `lane` under `key` (moving it if it is elsewhere).
    /// Ids or lanes out of range are ignored: a table without timers has
    /// no storage for them.
    pub(crate) fn set(&mut self, lane: usize, id: usize, key: u64) {
        if id >= self.ids || lane >= self.lanes() {
            return;
        }
        match self.get(id) {
            Some((old, l)) if l == lane => {
                if old == key {
                    return;
                }
                let place = self.place(id);
                self.entries[lane * self.ids + place].0 = key;
                if key < old {
                    self.up(lane, place);
                } else {
                    self.down(lane, place);
                }
                return;
            }
            Some(_) => self.remove(id),
            None => {}
        }
        let place = self.lens[lane];
        self.lens[lane] += 1;
        self.put(lane, place, (key, id as u32));
        self.up(lane, place);
    }

    /// Takes `id` out of its lane, if it is in one.
    pub(crate) fn remove(&mut self, id: usize) {
        let Some((_, lane)) = self.get(id) else {
            return;
        };
        let place = self.place(id);
        self.places[id] = 0;
        self.lens[lane] -= 1;
        let last = self.lens[lane];
        if place != last {
            let moved = self.entries[lane * self.ids + last];
            self.put(lane, place, moved);
            self.up(lane, place);
            self.down(lane, self.place(moved.1 as usize));
        }
    }

    fn place(&self, id: usize) -> usize {
        (self.places[id] & 0xffff_ffff) as usize - 1
    }

    fn put(&mut self, lane: usize, place: usize, e: HeapEntry) {
        self.entries[lane * self.ids + place] = e;
        self.places[e.1 as usize] = ((lane as u64) << 32) | (place as u64 + 1);
    }

    fn up(&mut self, lane: usize, mut place: usize) {
        let base = lane * self.ids;
        while place > 0 {
            let parent = (place - 1) / 2;
            let (e, p) = (self.entries[base + place], self.entries[base + parent]);
            if p <= e {
                break;
            }
            self.put(lane, place, p);
            self.put(lane, parent, e);
            place = parent;
        }
    }

    fn down(&mut self, lane: usize, mut place: usize) {
        let base = lane * self.ids;
        let len = self.lens[lane];
        loop {
            let (l, r) = (2 * place + 1, 2 * place + 2);
            let mut least = place;
            if l < len && self.entries[base + l] < self.entries[base + least] {
                least = l;
            }
            if r < len && self.entries[base + r] < self.entries[base + least] {
                least = r;
            }
            if least == place {
                break;
            }
            let (a, b) = (self.entries[base + place], self.entries[base + least]);
            self.put(lane, place, b);
            self.put(lane, least, a);
            place = least;
        }
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn lanes_give_their_least_key_through_moves_and_removals() {
        let ids = 200;
        let mut h = Heaps::new(HeapStorage::owned(&crate::handshake::HeapSizes::new(
            3, ids,
        )));
        let mut model: Vec<Option<(u64, usize)>> = alloc::vec![None; ids];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % ids as u64) as usize;
            if x & 0x300 == 0 {
                h.remove(id);
                model[id] = None;
            } else {
                let (key, lane) = ((x >> 20) % 1000, ((x >> 40) % 3) as usize);
                h.set(lane, id, key);
                model[id] = Some((key, lane));
            }
            for lane in 0..3 {
                let want = model
                    .iter()
                    .enumerate()
                    .filter_map(|(id, m)| m.filter(|m| m.1 == lane).map(|m| (m.0, id)))
                    .min();
                let got = h.peek(lane);
                assert_eq!(got.map(|g| g.0), want.map(|w| w.0));
                assert_eq!(
                    h.lane(lane).len(),
                    model.iter().flatten().filter(|m| m.1 == lane).count()
                );
            }
            assert_eq!(h.get(id), model[id]);
        }
    }
}
