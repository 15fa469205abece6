//! What the verbs transport costs the CPU per write, beyond moving the
//! bytes: posting (chunking, the window, the work request), reaping the
//! completion and handing it back, measured over the software stand-in
//! device, whose "NIC" is a memcpy. Each size runs the transport and the
//! bare memcpy side by side in alternating rounds; the table gives both
//! and the difference, the transport's own cost per write.
//!
//! `cargo bench -p tensorferry-bench --bench bookkeeping`
//! (`FERRY_BENCH_SIZES=64,4096` picks the sizes).

use std::hint::black_box;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{Region, Transport, WriteOp, WriteTag};
use tensorferry_hostmem::HostPool;
use tensorferry_verbs::sim::SimDevice;
use tensorferry_verbs::{VerbsConfig, VerbsTransport};

const ROUND: Duration = Duration::from_millis(300);
const ROUNDS: usize = 5;
const WINDOW: u64 = 32;

struct Node {
    t: VerbsTransport<SimDevice>,
    region: Region,
    _pool: HostPool,
}

fn node(pool_len: usize) -> Node {
    // A real port's maximum message is about 1 GiB: no chunking here.
    let device = SimDevice::new([127, 0, 0, 1], 1 << 30);
    let mut t = VerbsTransport::with_device(device, &VerbsConfig::new("sim")).expect("open");
    let pool = HostPool::new(pool_len).expect("pool");
    // SAFETY: the pool outlives the registration (`_pool` is dropped
    // after `t`).
    #[allow(unsafe_code)]
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.expect("register");
    Node {
        t,
        region,
        _pool: pool,
    }
}

/// Writes per second through the transport, `WINDOW` in flight.
fn transport_round(a: &mut Node, b: &Node, size: u64, slots: u64) -> f64 {
    let peer = b.t.session_id().to_owned();
    let (mut posted, mut done) = (0u64, 0u64);
    let t0 = Instant::now();
    // The clock is read every 256 turns: reading it costs more than a
    // turn on some machines.
    let mut turns = 0u32;
    while turns % 256 != 0 || t0.elapsed() < ROUND {
        turns = turns.wrapping_add(1);
        while posted - done < WINDOW {
            let slot = posted % slots;
            a.t.post_write(&WriteOp {
                region: a.region,
                local_offset: slot * size,
                len: size,
                dest_session: &peer,
                dest_addr: b.region.addr + slot * size,
                tag: WriteTag(posted),
                cookie: posted,
            })
            .expect("post");
            posted += 1;
        }
        while let Some(c) = a.t.poll_completion() {
            assert!(c.result.is_ok(), "{:?}", c.result);
            done += 1;
        }
    }
    while done < posted {
        if let Some(c) = a.t.poll_completion() {
            assert!(c.result.is_ok(), "{:?}", c.result);
            done += 1;
        }
    }
    done as f64 / t0.elapsed().as_secs_f64()
}

/// Copies per second of the same sizes between the same pools.
fn memcpy_round(a: &Node, b: &Node, size: u64, slots: u64) -> f64 {
    let mut n = 0u64;
    let t0 = Instant::now();
    while n % 256 != 0 || t0.elapsed() < ROUND {
        let slot = n % slots;
        // SAFETY: both ranges lie inside the two pools, which nothing else
        // touches while the benchmark runs.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                (a.region.addr + slot * size) as *const u8,
                (b.region.addr + slot * size) as *mut u8,
                size as usize,
            );
        }
        black_box(b.region.addr);
        n += 1;
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let pool = 64 << 20;
    let mut a = node(pool);
    let b = node(pool);
    println!(
        "{:>9} {:>14} {:>14} {:>12} {:>12} {:>14}",
        "size", "writes/s", "memcpy/s", "ns/write", "ns/memcpy", "transport ns"
    );
    let sizes: Vec<u64> = std::env::var("FERRY_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 4096, 65536, 1 << 20]);
    for size in sizes {
        let slots = (pool as u64 / size).min(1024);
        let (mut tr, mut mc) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            tr.push(transport_round(&mut a, &b, size, slots));
            mc.push(memcpy_round(&a, &b, size, slots));
        }
        let (tr, mc) = (median(tr), median(mc));
        let (ns_t, ns_m) = (1e9 / tr, 1e9 / mc);
        println!(
            "{size:>9} {tr:>14.0} {mc:>14.0} {ns_t:>12.0} {ns_m:>12.0} {:>14.0}",
            ns_t - ns_m
        );
    }
}
