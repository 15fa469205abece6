//! Golden vectors produced by the seed's own Python (`scripts/gen_golden.py`):
//! ferry must re-encode each one byte for byte, and must decode loose
//! variants to what Python encodes after reading them.

use std::path::PathBuf;

use tensorferry_core::wire::{
    decode, Manifest, Msg, Ready, Register, SlotList, Staged, TensorEntry,
};

fn lines(name: &str) -> Vec<Vec<u8>> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "tests",
        "data",
        "golden",
        name,
    ]
    .iter()
    .collect();
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    data.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn encode(msg: &Msg<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; msg.encoded_len(Default::default())];
    let n = msg.encode(&mut buf).expect("sized by encoded_len");
    buf.truncate(n);
    buf
}

fn encode_canonical(msg: &Msg<'_>) -> Vec<u8> {
    let mut small = [0u8; 8];
    let needed = match msg.encode_canonical(&mut small) {
        Ok(n) => n,
        Err(e) => e.needed,
    };
    let mut buf = vec![0u8; needed];
    let n = msg
        .encode_canonical(&mut buf)
        .expect("sized by the first attempt");
    assert_eq!(n, needed);
    buf
}

#[test]
fn canonical_vectors_reencode_byte_identically() {
    let vectors = lines("canonical.jsonl");
    assert!(vectors.len() >= 500, "only {} vectors", vectors.len());
    for line in &vectors {
        let msg = decode(line).unwrap_or_else(|e| panic!("{e}: {}", show(line)));
        assert_eq!(show(&encode(&msg)), show(line), "verbatim");
        assert_eq!(show(&encode_canonical(&msg)), show(line), "canonical");
    }
}

/// The decoder's fast path and the general decoder agree on every vector.
#[test]
fn fast_path_agrees_with_the_reference_decoder() {
    for line in lines("canonical.jsonl").iter().chain(&lines("loose.jsonl")) {
        assert_eq!(
            decode(line),
            tensorferry_core::wire::decode_reference(line),
            "{}",
            show(line)
        );
        let text = std::str::from_utf8(line).unwrap();
        assert_eq!(
            tensorferry_core::json::RawJson::parse(text),
            tensorferry_core::json::RawJson::parse_precise(text)
        );
    }
}

#[test]
fn every_message_type_is_covered() {
    let vectors = lines("canonical.jsonl");
    for ty in tensorferry_core::wire::MsgType::ALL {
        let n = vectors
            .iter()
            .filter(|l| decode(l).map(|m| m.msg_type() == ty).unwrap_or(false))
            .count();
        assert!(n >= 20, "{ty}: {n} vectors");
    }
}

#[test]
fn loose_variants_decode_to_the_seeds_canonical_bytes() {
    let loose = lines("loose.jsonl");
    let want = lines("loose.canonical.jsonl");
    assert_eq!(loose.len(), want.len());
    assert!(loose.len() >= 1000);
    for (l, w) in loose.iter().zip(&want) {
        let msg = decode(l).unwrap_or_else(|e| panic!("{e}: {}", show(l)));
        assert_eq!(show(&encode_canonical(&msg)), show(w), "input: {}", show(l));
    }
}

/// Floats inside nested values print as Python's `repr` prints them, ties
/// and all.
#[test]
fn floats_print_as_python_prints_them() {
    let input = lines("floats.jsonl");
    let want = lines("floats.canonical.jsonl");
    assert_eq!(input.len(), want.len());
    assert!(input.len() > 5000);
    for (l, w) in input.iter().zip(&want) {
        let msg = decode(l).unwrap_or_else(|e| panic!("{e}: {}", show(l)));
        assert_eq!(show(&encode_canonical(&msg)), show(w), "input: {}", show(l));
    }
}

/// The typed views of nested values agree with the raw text: rebuilding a
/// message from its iterated manifest entries and slots encodes the same bytes.
#[test]
fn typed_manifest_and_slots_rebuild_the_same_bytes() {
    let mut entries_seen = 0;
    let mut slots_seen = 0;
    for line in lines("canonical.jsonl") {
        let msg = decode(&line).unwrap();
        // The manifest of a message that has one, as its iterated entries.
        let entries: Vec<TensorEntry<'_>> = match msg {
            Msg::Staged(Staged { manifest, .. }) | Msg::Ready(Ready { manifest, .. }) => {
                manifest.iter().collect::<Result<_, _>>().unwrap()
            }
            _ => Vec::new(),
        };
        entries_seen += entries.len();
        let manifest = Manifest::Entries(&entries);
        let rebuilt = match msg {
            Msg::Staged(m) => encode(&Msg::Staged(Staged { manifest, ..m })),
            Msg::Ready(m) => encode(&Msg::Ready(Ready { manifest, ..m })),
            Msg::Register(m) => {
                let slots: Vec<_> = m
                    .preallocated_slots
                    .iter()
                    .collect::<Result<_, _>>()
                    .unwrap();
                slots_seen += slots.len();
                encode(&Msg::Register(Register {
                    preallocated_slots: SlotList::Slots(&slots),
                    ..m
                }))
            }
            _ => continue,
        };
        assert_eq!(show(&rebuilt), show(&line));
    }
    assert!(
        entries_seen > 500 && slots_seen > 100,
        "{entries_seen} {slots_seen}"
    );
}

/// Encodes in sglang 0.5.23's dialect, nested JSON as Python re-emits it.
fn encode_sglang(msg: &Msg<'_>) -> Vec<u8> {
    use tensorferry_core::json::Sink;
    use tensorferry_core::wire::{Dialect, Style};
    let mut counter = Sink::new(&mut []);
    msg.write_dialect(&mut counter, Style::Canonical, Dialect::Sglang);
    let mut buf = vec![0u8; counter.len()];
    let mut sink = Sink::new(&mut buf);
    msg.write_dialect(&mut sink, Style::Canonical, Dialect::Sglang);
    let n = sink.finish().expect("sized by the count");
    buf.truncate(n);
    buf
}

/// sglang 0.5.23's own encoder wrote these (`scripts/gen_golden_sglang.py`):
/// its `transfer_staged` always with `scalar_fields`, the denoiser's
/// forward (`transfer_done{staged_for_decoder}`) and the head's fast-path
/// `transfer_ready` (`_prealloc_slot_id` inside `scalar_fields`). ferry
/// decodes each and writes it back byte for byte in its sglang dialect.
#[test]
fn sglang_0_5_23_vectors_reencode_byte_identically_in_its_dialect() {
    let vectors = lines("sglang-0.5.23.jsonl");
    assert!(vectors.len() >= 300, "only {} vectors", vectors.len());
    let (mut forwards, mut staged_empty, mut slot_ids) = (0, 0, 0);
    for line in &vectors {
        let msg = decode(line).unwrap_or_else(|e| panic!("{e}: {}", show(line)));
        assert_eq!(show(&encode_sglang(&msg)), show(line));
        match msg {
            Msg::Done(d) if d.staged_for_decoder => {
                forwards += 1;
                // The forward is a staged next leg, field for field.
                let s = d.staged().unwrap();
                assert_eq!((s.request_id, s.data_size), (d.request_id, d.data_size));
            }
            Msg::Staged(s) if s.scalar_fields.is_empty_container() => {
                staged_empty += 1;
                // The seed's dialect leaves an empty `scalar_fields` out.
                assert!(!show(&encode(&msg)).contains("scalar_fields"));
            }
            Msg::Ready(r) if r.scalar_fields.get("_prealloc_slot_id").is_some() => slot_ids += 1,
            _ => {}
        }
    }
    assert!(
        forwards > 10 && staged_empty > 5 && slot_ids > 10,
        "{forwards} {staged_empty} {slot_ids}"
    );
}

/// The fast path's slot id goes inside `scalar_fields` as its last key, as
/// the head's Python appends it, whatever the object's spelling.
#[test]
fn the_prealloc_slot_id_is_appended_inside_the_scalar_fields() {
    use tensorferry_core::json::RawJson;
    for (scalars, verbatim, canonical) in [
        (
            "{}",
            r#"{"_prealloc_slot_id":3}"#,
            r#"{"_prealloc_slot_id":3}"#,
        ),
        // Verbatim keeps the spelling as relayed, whitespace too.
        (
            "{ }",
            r#"{ "_prealloc_slot_id":3}"#,
            r#"{"_prealloc_slot_id":3}"#,
        ),
        (
            r#"{ "a" : 1.50 }"#,
            r#"{ "a" : 1.50 ,"_prealloc_slot_id":3}"#,
            r#"{"a":1.5,"_prealloc_slot_id":3}"#,
        ),
    ] {
        let msg = Msg::Ready(Ready {
            request_id: "r".into(),
            scalar_fields: RawJson::parse_object(scalars).unwrap(),
            prealloc_slot_id: Some(3),
            ..Default::default()
        });
        let want = |s: &str| {
            format!(
                r#"{{"msg_type":"transfer_ready","request_id":"r","manifest":{{}},"slot_offset":0,"scalar_fields":{s}}}"#
            )
        };
        assert_eq!(show(&encode(&msg)), want(verbatim));
        assert_eq!(show(&encode_canonical(&msg)), want(canonical));
        // What sglang's receiver reads: the relayed fields and the id.
        let bytes = encode(&msg);
        let Msg::Ready(r) = decode(&bytes).unwrap() else {
            panic!()
        };
        assert_eq!(
            r.scalar_fields.get("_prealloc_slot_id").map(|v| v.as_str()),
            Some("3")
        );
    }
}
