//! The slot-allocator workloads shared by `ferry bench slots` and
//! `cargo bench`, the same as `bench/python/buddy_python.py` runs: a 1 GiB pool,
//! 1 MiB minimum block, requests of 1 to 64 MiB.

use std::time::{Duration, Instant};

use tensorferry_core::slots::{Buddy, BuddyConfig, BuddyError, SlotHandle};

const MIB: u64 = 1 << 20;

/// The pool every workload runs on.
pub const CONFIG: BuddyConfig = BuddyConfig {
    pool_size: 1 << 30,
    min_block: MIB,
    pool_id: 0,
};

/// Knuth's MMIX LCG, the stream `bench/python/buddy_python.py` draws from too.
#[derive(Clone, Debug)]
pub struct Lcg(u64);

impl Lcg {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 31 bits.
    pub fn next_u31(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Storage for an allocator of [`CONFIG`].
pub fn storage() -> Result<(Vec<u8>, Vec<u32>), BuddyError> {
    let (nodes, gens) = Buddy::storage_needed(&CONFIG)?;
    Ok((vec![0; nodes], vec![0; gens]))
}

/// `n` allocate+free pairs, sizes 1..64 MiB in turn. Returns operations done.
pub fn pairs(b: &mut Buddy<'_>, n: u64, i0: u64) -> Result<u64, BuddyError> {
    for i in i0..i0 + n {
        let h = b.allocate((i % 64 + 1) * MIB)?;
        b.free(h)?;
    }
    Ok(2 * n)
}

/// `n` steps of the random mix over `live`. Returns operations done.
pub fn churn(
    b: &mut Buddy<'_>,
    rng: &mut Lcg,
    live: &mut Vec<SlotHandle>,
    n: u64,
) -> Result<u64, BuddyError> {
    for _ in 0..n {
        let r = rng.next_u31();
        if !live.is_empty() && r & 1 == 1 {
            let j = (rng.next_u31() % live.len() as u64) as usize;
            b.free(live.swap_remove(j))?;
        } else {
            match b.allocate((rng.next_u31() % 64 + 1) * MIB) {
                Ok(h) => live.push(h),
                Err(BuddyError::OutOfSpace { .. }) if !live.is_empty() => {
                    let j = (rng.next_u31() % live.len() as u64) as usize;
                    b.free(live.swap_remove(j))?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

/// Operations per second of each workload, run for about `duration` each.
pub fn measure(duration: Duration) -> Result<[(&'static str, f64); 2], BuddyError> {
    let (mut tree, mut gens) = storage()?;
    let mut b = Buddy::new(CONFIG, &mut tree, &mut gens)?;
    let start = Instant::now();
    let (mut ops, mut i) = (0u64, 0u64);
    while start.elapsed() < duration {
        ops += pairs(&mut b, 1024, i)?;
        i += 1024;
    }
    let pairs_rate = ops as f64 / start.elapsed().as_secs_f64();

    let (mut tree, mut gens) = storage()?;
    let mut b = Buddy::new(CONFIG, &mut tree, &mut gens)?;
    let (mut rng, mut live) = (Lcg::new(42), Vec::new());
    let start = Instant::now();
    let mut ops = 0u64;
    while start.elapsed() < duration {
        ops += churn(&mut b, &mut rng, &mut live, 1024)?;
    }
    let churn_rate = ops as f64 / start.elapsed().as_secs_f64();
    Ok([("pairs", pairs_rate), ("churn", churn_rate)])
}
