//! The buddy allocator against a simple model: a map of which leaves are in
//! use. Thousands of random operation sequences; after every step the
//! allocator must agree with the model exactly.

use proptest::prelude::*;
use tensorferry_core::slots::{Buddy, BuddyConfig, BuddyError, SlotHandle};

#[derive(Clone, Debug)]
enum Op {
    /// Allocate this many bytes.
    Alloc(u64),
    /// Free the live slot at this index (modulo the count).
    Free(usize),
    /// Free a handle freed earlier (index modulo their count).
    FreeAgain(usize),
    /// Free a made-up handle.
    Forge {
        offset: u64,
        size: u64,
        generation: u32,
        pool_id: u32,
    },
}

struct Model {
    leaves: u64,
    min_block: u64,
    used: Vec<bool>,
    live: Vec<SlotHandle>,
    freed: Vec<SlotHandle>,
}

impl Model {
    fn pool(&self) -> u64 {
        self.leaves * self.min_block
    }

    /// Orders whose block fits the pool at all.
    fn max_order(&self) -> Option<u32> {
        (0..64).rev().find(|&k| (1u64 << k) <= self.leaves)
    }

    /// The lowest aligned free position (in leaves) of `order`, if any.
    fn first_free(&self, order: u32) -> Option<u64> {
        let n = 1u64 << order;
        (0..self.leaves / n)
            .map(|j| j * n)
            .find(|&p| (p..p + n).all(|l| !self.used[l as usize]))
    }

    fn largest_free(&self) -> u64 {
        let Some(top) = self.max_order() else {
            return 0;
        };
        (0..=top)
            .rev()
            .find(|&k| self.first_free(k).is_some())
            .map_or(0, |k| self.min_block << k)
    }

    fn mark(&mut self, h: &SlotHandle, used: bool) {
        let first = h.offset() / self.min_block;
        for l in first..first + h.size() / self.min_block {
            assert_eq!(self.used[l as usize], !used, "leaf {l} double-booked");
            self.used[l as usize] = used;
        }
    }
}

fn ops(max_bytes: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (0..=max_bytes + max_bytes / 4).prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeAgain),
        1 => (0..=max_bytes, 0..=max_bytes, 0..4u32, 0..2u32)
            .prop_map(|(offset, size, generation, pool_id)| Op::Forge { offset, size, generation, pool_id }),
    ];
    prop::collection::vec(op, 1..60)
}

fn check(b: &Buddy<'_>, m: &Model) {
    let allocated: u64 = m.live.iter().map(SlotHandle::size).sum();
    let s = b.stats();
    assert_eq!(s.live_slots, m.live.len() as u64);
    assert_eq!(s.allocated_bytes, allocated);
    assert_eq!(b.bytes_free(), m.pool() - allocated);
    assert_eq!(
        b.free_slots_of(m.min_block),
        (m.pool() - allocated) / m.min_block
    );
    assert_eq!(b.largest_free(), m.largest_free());
    let f = b.fragmentation();
    assert_eq!(
        (f.bytes_free, f.largest_free),
        (b.bytes_free(), b.largest_free())
    );
    // No two live slots overlap, all lie inside the pool (mark() asserted
    // the leaves; check the bounds).
    for h in &m.live {
        assert!(h.offset() + h.size() <= m.pool());
        assert_eq!(h.offset() % h.size(), 0, "slots are aligned to their size");
    }
}

fn run(leaves: u64, min_shift: u32, ops: Vec<Op>) {
    let min_block = 1u64 << min_shift;
    let config = BuddyConfig {
        pool_size: leaves * min_block,
        min_block,
        pool_id: 1,
    };
    let (nodes, gens) = Buddy::storage_needed(&config).unwrap();
    let (mut tree, mut generations) = (vec![0u8; nodes], vec![0u32; gens]);
    let mut b = Buddy::new(config, &mut tree, &mut generations).unwrap();
    let initial_blocks = b.free_blocks_by_order().to_vec();
    let mut m = Model {
        leaves,
        min_block,
        used: vec![false; leaves as usize],
        live: Vec::new(),
        freed: Vec::new(),
    };
    check(&b, &m);
    for op in ops {
        match op {
            Op::Alloc(size) => {
                let order = (size > 0).then(|| {
                    size.div_ceil(min_block)
                        .next_power_of_two()
                        .trailing_zeros()
                });
                let fits = order.filter(|&k| Some(k) <= m.max_order());
                match (b.allocate(size), order, fits) {
                    (Err(BuddyError::ZeroSize), None, _) => {}
                    (Err(BuddyError::TooLarge { .. }), Some(_), None) => {}
                    (Ok(h), _, Some(k)) => {
                        // The lowest free aligned block of the right order.
                        assert_eq!(Some(h.offset() / min_block), m.first_free(k), "placement");
                        assert_eq!(h.size(), min_block << k);
                        m.mark(&h, true);
                        m.live.push(h);
                    }
                    (Err(BuddyError::OutOfSpace { .. }), _, Some(k)) => {
                        assert_eq!(m.first_free(k), None, "a free block of order {k} was there");
                    }
                    (r, o, f) => panic!("allocate({size}): {r:?}, model order {o:?} fits {f:?}"),
                }
            }
            Op::Free(i) if !m.live.is_empty() => {
                let h = m.live.swap_remove(i % m.live.len());
                b.free(h.clone()).unwrap();
                m.mark(&h, false);
                m.freed.push(h);
            }
            Op::Free(_) => {}
            Op::FreeAgain(i) if !m.freed.is_empty() => {
                let h = m.freed[i % m.freed.len()].clone();
                let e = b.free(h).unwrap_err();
                assert!(
                    matches!(
                        e,
                        BuddyError::NotAllocated { .. } | BuddyError::StaleHandle { .. }
                    ),
                    "{e:?}"
                );
            }
            Op::FreeAgain(_) => {}
            Op::Forge {
                offset,
                size,
                generation,
                pool_id,
            } => {
                let forged = SlotHandle::from_parts(offset, size, 0, generation, pool_id);
                let matches_live = m.live.iter().position(|h| {
                    (h.offset(), h.size(), h.generation(), h.pool_id())
                        == (offset, size, generation, pool_id)
                });
                match (b.free(forged), matches_live) {
                    (Ok(()), Some(i)) => {
                        let h = m.live.swap_remove(i);
                        m.mark(&h, false);
                    }
                    (Err(_), None) => {}
                    (r, i) => panic!(
                        "forged ({offset},{size},{generation},{pool_id}): {r:?}, live match {i:?}"
                    ),
                }
            }
        }
        check(&b, &m);
    }
    for h in std::mem::take(&mut m.live) {
        b.free(h.clone()).unwrap();
        m.mark(&h, false);
    }
    check(&b, &m);
    // Everything free again: the same maximal blocks as at the start.
    assert_eq!(b.free_blocks_by_order(), &initial_blocks[..]);
    assert_eq!(b.bytes_free(), m.pool());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn matches_the_interval_model(leaves in 1u64..=96, min_shift in 0u32..=20, ops in ops(96)) {
        // Sizes are drawn in min-block units, then scaled.
        let ops = ops.into_iter().map(|op| match op {
            Op::Alloc(n) => Op::Alloc(if n == 0 { 0 } else { (n << min_shift) - (n & 1) * ((1u64 << min_shift) / 2) }),
            Op::Forge { offset, size, generation, pool_id } => Op::Forge { offset: offset << min_shift, size: size << min_shift, generation, pool_id },
            other => other,
        }).collect();
        run(leaves, min_shift, ops);
    }

    #[test]
    fn power_of_two_pools(order in 0u32..=8, ops in ops(256)) {
        run(1 << order, 0, ops);
    }
}

/// A rebuilt handle that names a live slot but another requested length
/// (here 0 for 9) frees the slot; the statistics stay within their bounds
/// (found by `matches_the_interval_model`: the requested bytes underflowed).
#[test]
fn a_rebuilt_handle_with_another_requested_length_frees_its_slot() {
    let forge = Op::Forge {
        offset: 32,
        size: 16,
        generation: 1,
        pool_id: 1,
    };
    run(48, 0, vec![Op::Alloc(17), Op::Alloc(9), forge]);
}

#[test]
fn a_terabyte_pool_with_megabyte_blocks() {
    let config = BuddyConfig {
        pool_size: 1 << 40,
        min_block: 1 << 20,
        pool_id: 7,
    };
    let (nodes, gens) = Buddy::storage_needed(&config).unwrap();
    assert_eq!((nodes, gens), ((2 << 20) - 1, 1 << 20));
    let (mut tree, mut generations) = (vec![0u8; nodes], vec![0u32; gens]);
    let mut b = Buddy::new(config, &mut tree, &mut generations).unwrap();
    assert_eq!(b.largest_free(), 1 << 40);
    let whole = b.allocate(1 << 40).unwrap();
    assert!(matches!(
        b.allocate(1),
        Err(BuddyError::OutOfSpace {
            largest_free: 0,
            ..
        })
    ));
    b.free(whole).unwrap();
    let small: Vec<_> = (0..1000)
        .map(|i| b.allocate(1 + i * 4096).unwrap())
        .collect();
    assert_eq!(b.stats().live_slots, 1000);
    for h in small {
        b.free(h).unwrap();
    }
    assert_eq!(b.bytes_free(), 1 << 40);
    assert_eq!(b.free_blocks_by_order().iter().sum::<u64>(), 1);
}

/// A pool of `pool_size` bytes in 1 MiB blocks.
fn megabyte_blocks(pool_size: u64, pool_id: u32) -> BuddyConfig {
    BuddyConfig {
        pool_size,
        min_block: 1 << 20,
        pool_id,
    }
}

#[test]
fn bad_configurations_are_typed_errors() {
    let new = |pool_size, min_block| {
        let c = BuddyConfig {
            pool_size,
            min_block,
            pool_id: 0,
        };
        Buddy::storage_needed(&c).map(drop)
    };
    assert_eq!(
        new(1 << 20, 0),
        Err(BuddyError::MinBlockNotPowerOfTwo { min_block: 0 })
    );
    assert_eq!(
        new(1 << 20, 3000),
        Err(BuddyError::MinBlockNotPowerOfTwo { min_block: 3000 })
    );
    assert!(matches!(
        new(0, 1024),
        Err(BuddyError::PoolNotMultipleOfMinBlock { .. })
    ));
    assert!(matches!(
        new(1000, 1024),
        Err(BuddyError::PoolNotMultipleOfMinBlock { .. })
    ));
    assert!(matches!(
        new(3 * 1024 + 1, 1024),
        Err(BuddyError::PoolNotMultipleOfMinBlock { .. })
    ));
    let c = megabyte_blocks(8 << 20, 0);
    let (mut tree, mut gens) = (vec![0u8; 14], vec![0u32; 8]);
    assert_eq!(
        Buddy::new(c, &mut tree, &mut gens).map(drop),
        Err(BuddyError::StorageTooSmall {
            tree_needed: 15,
            generations_needed: 8
        })
    );
}

#[test]
fn sizes_that_overflow_when_rounded_are_too_large() {
    let c = megabyte_blocks(3 << 20, 0);
    let (mut tree, mut gens) = (vec![0u8; 7], vec![0u32; 3]);
    let mut b = Buddy::new(c, &mut tree, &mut gens).unwrap();
    assert_eq!(b.max_slot(), 2 << 20);
    for size in [u64::MAX, (1 << 63) + 1, 3 << 20, (2 << 20) + 1] {
        assert!(
            matches!(b.allocate(size), Err(BuddyError::TooLarge { .. })),
            "{size}"
        );
    }
    assert_eq!(b.allocate(0), Err(BuddyError::ZeroSize));
    assert_eq!(b.stats().failures.too_large, 4);
    assert_eq!(b.stats().failures.zero_size, 1);
    // The pool is used whole although it is not a power of two.
    let a = b.allocate(2 << 20).unwrap();
    let c1 = b.allocate(1).unwrap();
    assert_eq!((a.offset(), c1.offset()), (0, 2 << 20));
    assert_eq!(b.bytes_free(), 0);
}

#[test]
fn stale_foreign_and_double_frees_change_nothing() {
    let c = megabyte_blocks(4 << 20, 3);
    let (mut tree, mut gens) = (vec![0u8; 7], vec![0u32; 4]);
    let mut b = Buddy::new(c, &mut tree, &mut gens).unwrap();
    let first = b.allocate(1 << 20).unwrap();
    let copy = first.clone();
    b.free(first).unwrap();
    assert_eq!(
        b.free(copy.clone()),
        Err(BuddyError::NotAllocated { offset: 0 })
    );
    let second = b.allocate(1 << 20).unwrap();
    assert_eq!(second.offset(), 0);
    assert_eq!(
        b.free(copy),
        Err(BuddyError::StaleHandle {
            offset: 0,
            generation: 1,
            current: 2
        })
    );
    let foreign = SlotHandle::from_parts(0, 1 << 20, 0, 2, 9);
    assert_eq!(
        b.free(foreign),
        Err(BuddyError::ForeignHandle {
            handle_pool: 9,
            pool: 3
        })
    );
    let misaligned = SlotHandle::from_parts(1 << 19, 1 << 20, 0, 2, 3);
    assert!(matches!(
        b.free(misaligned),
        Err(BuddyError::InvalidHandle { .. })
    ));
    let wrong_size = SlotHandle::from_parts(0, 2 << 20, 0, 2, 3);
    assert_eq!(
        b.free(wrong_size),
        Err(BuddyError::NotAllocated { offset: 0 })
    );
    let f = b.stats().failures;
    assert_eq!(
        (
            f.not_allocated,
            f.stale_handle,
            f.foreign_handle,
            f.invalid_handle
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(b.stats().live_slots, 1);
    b.free(second).unwrap();
    assert_eq!(b.largest_free(), 4 << 20);
}
