//! `cargo bench -p tensorferry-bench --bench wire`: the control-plane codec, piece by piece.
//! The side-by-side comparison with the seed's Python is
//! `bench/python/vs_python.sh`; this one breaks ferry's time down.

mod quick;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use tensorferry_bench::wire::{encode_decode, encode_decode_walk, push_msg, staged_msg};
use tensorferry_core::wire::{decode, Msg};

fn codec(c: &mut Criterion) {
    for (name, msg) in [("staged", staged_msg()), ("push", push_msg())] {
        let mut buf = vec![0u8; msg.encoded_len(Default::default())];
        let n = msg.encode(&mut buf).expect("sized by encoded_len");
        let payload = buf[..n].to_vec();
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(1));
        g.bench_function("encode", |b| b.iter(|| black_box(&msg).encode(&mut buf)));
        g.bench_function("decode", |b| b.iter(|| decode(black_box(&payload))));
        g.bench_function("decode+walk", |b| {
            b.iter(|| match decode(black_box(&payload)) {
                Ok(Msg::Staged(m)) => m.manifest.validate().ok(),
                _ => None,
            })
        });
        g.bench_function("encode+decode", |b| {
            b.iter(|| encode_decode(black_box(&msg), &mut buf))
        });
        g.bench_function("encode+decode+walk", |b| {
            b.iter(|| encode_decode_walk(black_box(&msg), &mut buf))
        });
        g.finish();
    }
}

fn main() {
    quick::run(codec);
}
