//! `cargo bench -p tensorferry-bench --bench wire`: the control-plane codec, piece by piece.
//! The side-by-side comparison with the seed's Python is
//! `bench/python/vs_python.sh`; this one breaks ferry's time down.
//!
//! Each group is one message kind of a slow-path hand-off (`ferry bench
//! scale`): staged, alloc, allocated, push, pushed, ready and done, with
//! the values such a hand-off carries.

mod quick;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use tensorferry_bench::wire::{encode_decode, encode_decode_walk, push_msg, staged_msg};
use tensorferry_core::json::{JsonStr, RawJson};
use tensorferry_core::wire::{
    decode, Alloc, Allocated, Done, Manifest, Msg, Pushed, Ready, Staged,
};

const REQUEST: JsonStr<'static> = JsonStr::plain("req-000042-3f9c2a7e");

/// The staged message's manifest and scalar fields as a receiver holds
/// them: raw JSON, as decoded, which the coordinator forwards in `ready`.
fn raw_nested() -> (RawJson<'static>, RawJson<'static>) {
    let Msg::Staged(staged) = staged_msg() else {
        unreachable!("staged_msg is a staged message")
    };
    let mut buf = vec![0u8; 4096];
    let mut sink = tensorferry_core::json::Sink::new(&mut buf);
    staged.manifest.write_json(&mut sink, Default::default());
    let n = sink.finish().expect("a manifest under 4 KiB");
    buf.truncate(n);
    let text: &'static str = String::from_utf8(buf).expect("JSON is UTF-8").leak();
    let manifest = RawJson::parse_object(text).expect("an encoded manifest");
    let scalars =
        RawJson::parse_object(r#"{"prompt":"a red fox","steps":50}"#).expect("a literal object");
    (manifest, scalars)
}

/// The messages of one slow-path hand-off, by name.
fn messages() -> Vec<(&'static str, Msg<'static>)> {
    let (manifest, scalars) = raw_nested();
    vec![
        ("staged", staged_msg()),
        (
            "staged_raw",
            Msg::Staged(Staged {
                request_id: REQUEST,
                data_size: 14_088_704,
                manifest: Manifest::Raw(manifest),
                session_id: JsonStr::plain("10.0.0.7:5557/mlx5_0"),
                pool_ptr: 140_245_832_663_040,
                slot_offset: 268_435_456,
                scalar_fields: scalars,
            }),
        ),
        (
            "alloc",
            Msg::Alloc(Alloc {
                request_id: REQUEST,
                data_size: 14_088_704,
                source_role: JsonStr::plain("encoder"),
                ..Alloc::default()
            }),
        ),
        (
            "allocated",
            Msg::Allocated(Allocated {
                request_id: REQUEST,
                session_id: JsonStr::plain("10.0.0.9:5557/mlx5_1"),
                pool_ptr: 139_912_077_262_848,
                slot_offset: 268_435_456,
                slot_size: 16_777_216,
            }),
        ),
        ("push", push_msg()),
        (
            "pushed",
            Msg::Pushed(Pushed {
                request_id: REQUEST,
                success: true,
                error: None,
            }),
        ),
        (
            "ready",
            Msg::Ready(Ready {
                request_id: REQUEST,
                manifest: Manifest::Raw(manifest),
                slot_offset: 268_435_456,
                scalar_fields: scalars,
                ..Ready::default()
            }),
        ),
        (
            "done",
            Msg::Done(Done {
                request_id: REQUEST,
                ..Done::default()
            }),
        ),
    ]
}

fn codec(c: &mut Criterion) {
    for (name, msg) in messages() {
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
                Ok(Msg::Ready(m)) => m.manifest.validate().ok(),
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
