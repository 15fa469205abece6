//! `cargo bench -p tensorferry-bench --bench slots`: the buddy allocator on the workloads of
//! `bench/python/buddy_python.py` (side by side: `bench/python/vs_python.sh slots`).

mod quick;

use criterion::{Criterion, Throughput};
use tensorferry_bench::slots::{churn, pairs, storage, Lcg, CONFIG};
use tensorferry_core::slots::Buddy;

fn slots(c: &mut Criterion) {
    let (mut tree, mut gens) = storage().expect("storage for the bench pool");
    let mut b = Buddy::new(CONFIG, &mut tree, &mut gens).expect("bench pool");
    let mut g = c.benchmark_group("buddy");
    g.throughput(Throughput::Elements(2 * 64));
    let mut i = 0;
    g.bench_function("alloc+free x64", |bench| {
        bench.iter(|| {
            i += 64;
            pairs(&mut b, 64, i)
        })
    });
    g.throughput(Throughput::Elements(64));
    let (mut rng, mut live) = (Lcg::new(42), Vec::new());
    g.bench_function("churn x64", |bench| {
        bench.iter(|| churn(&mut b, &mut rng, &mut live, 64))
    });
    g.finish();
}

fn main() {
    quick::run(slots);
}
