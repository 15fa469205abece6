//! Arbitrary operation sequences against the buddy allocator: allocations of
//! any size, frees of live, freed and made-up handles. No panic; no two live
//! slots overlap; every slot lies in the pool; the free-space figures always
//! add up; freeing everything restores the initial blocks.
#![no_main]

use arbitrary::Arbitrary;
use tensorferry_core::slots::{Buddy, BuddyConfig, SlotHandle};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Alloc(u64),
    Free(u16),
    FreeAgain(u16),
    Forge(u64, u64, u32, u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    leaves: u16,
    min_shift: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let leaves = u64::from(input.leaves % 512) + 1;
    let min_block = 1u64 << (input.min_shift % 40);
    let config = BuddyConfig {
        pool_size: leaves * min_block,
        min_block,
        pool_id: 1,
    };
    let (nodes, gens) = Buddy::storage_needed(&config).expect("valid config");
    let (mut tree, mut generations) = (vec![0u8; nodes], vec![0u32; gens]);
    let mut b = Buddy::new(config, &mut tree, &mut generations).expect("enough storage");
    let initial = b.free_blocks_by_order().to_vec();
    let mut used = vec![false; leaves as usize];
    let mut live: Vec<SlotHandle> = Vec::new();
    let mut freed: Vec<SlotHandle> = Vec::new();
    let mark = |used: &mut Vec<bool>, h: &SlotHandle, to: bool| {
        assert!(
            h.offset() + h.size() <= config.pool_size,
            "slot outside the pool"
        );
        for l in h.offset() / min_block..(h.offset() + h.size()) / min_block {
            assert_ne!(used[l as usize], to, "overlap or double free at leaf {l}");
            used[l as usize] = to;
        }
    };
    for op in input.ops.into_iter().take(2000) {
        match op {
            Op::Alloc(size) => {
                if let Ok(h) = b.allocate(size) {
                    assert!(h.size() >= size);
                    mark(&mut used, &h, true);
                    live.push(h);
                }
            }
            Op::Free(i) if !live.is_empty() => {
                let h = live.swap_remove(usize::from(i) % live.len());
                b.free(h.clone()).expect("live handle frees");
                mark(&mut used, &h, false);
                freed.push(h);
            }
            Op::FreeAgain(i) if !freed.is_empty() => {
                assert!(b.free(freed[usize::from(i) % freed.len()].clone()).is_err());
            }
            Op::Forge(offset, size, generation, pool_id) => {
                let forged = SlotHandle::from_parts(offset, size, 0, generation, pool_id);
                let matching = live.iter().position(|h| {
                    (h.offset(), h.size(), h.generation(), h.pool_id())
                        == (offset, size, generation, pool_id)
                });
                match (b.free(forged), matching) {
                    (Ok(()), Some(i)) => {
                        let h = live.swap_remove(i);
                        mark(&mut used, &h, false);
                    }
                    (Err(_), None) => {}
                    (r, m) => panic!("forged handle: {r:?} with live match {m:?}"),
                }
            }
            _ => {}
        }
        let allocated: u64 = live.iter().map(SlotHandle::size).sum();
        assert_eq!(b.bytes_free() + allocated, config.pool_size);
        assert_eq!(b.stats().live_slots, live.len() as u64);
        assert!(b.largest_free() <= b.bytes_free());
    }
    for h in live {
        b.free(h).expect("live handle frees");
    }
    assert_eq!(b.free_blocks_by_order(), &initial[..]);
});
