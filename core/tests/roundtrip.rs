//! Property tests: encode → decode → encode is the identity on bytes and on
//! values, for every message type and arbitrary field values.

use proptest::prelude::*;
use tensorferry_core::json::{RawJson, Sink};
use tensorferry_core::wire::*;

/// A tensor entry's owned parts: field, list index, offset, shape, dtype.
type OwnedEntry = (String, Option<u64>, u64, Vec<u64>, String);

/// Owned material a borrowed `Msg` is built from.
#[derive(Debug, Clone)]
struct Owned {
    ty: MsgType,
    strs: [String; 4],
    nums: [u64; 4],
    flags: [bool; 2],
    opt: Option<String>,
    entries: Vec<OwnedEntry>,
    slots: Vec<PreallocatedSlot>,
    scalars: String,
}

fn json_value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        prop_oneof![
            Just("NaN"),
            Just("Infinity"),
            Just("-Infinity"),
            Just("1e-05"),
            Just("-0.0"),
            Just("2.5E+300")
        ]
        .prop_map(str::to_string),
        any::<String>().prop_map(|s| quote(&s)),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(" , "))),
            prop::collection::vec((any::<String>(), inner), 0..4).prop_map(|kv| {
                let parts: Vec<_> = kv
                    .iter()
                    .map(|(k, v)| format!("{}:\t{}", quote(k), v))
                    .collect();
                format!("{{ {} }}", parts.join(","))
            }),
        ]
    })
}

/// Quotes with Rust's escaping rules restricted to JSON's: a second,
/// independent encoder for the test.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn owned() -> impl Strategy<Value = Owned> {
    let entry = (
        any::<String>(),
        any::<Option<u64>>(),
        any::<u64>(),
        prop::collection::vec(any::<u64>(), 0..6),
        any::<String>(),
    );
    let slot = (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(offset, size, slot_id, addr)| PreallocatedSlot {
            offset,
            size,
            slot_id,
            addr,
        },
    );
    (
        prop::sample::select(MsgType::ALL.to_vec()),
        any::<[String; 4]>(),
        any::<[u64; 4]>(),
        any::<[bool; 2]>(),
        any::<Option<String>>(),
        prop::collection::vec(entry, 0..8),
        prop::collection::vec(slot, 0..5),
        prop::collection::vec((any::<String>(), json_value()), 0..4),
    )
        .prop_map(|(ty, strs, nums, flags, opt, entries, slots, kv)| {
            let parts: Vec<_> = kv
                .iter()
                .map(|(k, v)| format!("{}: {}", quote(k), v))
                .collect();
            Owned {
                ty,
                strs,
                nums,
                flags,
                opt,
                entries,
                slots,
                scalars: format!("{{{}}}", parts.join(", ")),
            }
        })
}

fn build<'a>(o: &'a Owned, entries: &'a [TensorEntry<'a>]) -> Msg<'a> {
    let s = |i: usize| JsonStr::plain(&o.strs[i]);
    let opt = o.opt.as_deref().map(JsonStr::plain);
    let scalars = RawJson::parse_object(&o.scalars).expect("generated JSON is valid");
    let [n0, n1, n2, n3] = o.nums;
    match o.ty {
        MsgType::Register => Msg::Register(Register {
            role: s(0),
            session_id: s(1),
            pool_ptr: n0,
            pool_size: n1,
            work_endpoint: s(2),
            preallocated_slots: SlotList::Slots(&o.slots),
            write_lifetime_ms: n2,
        }),
        MsgType::RegisterAck => Msg::RegisterAck(RegisterAck {
            session_id: s(0),
            role: s(1),
            accepted: o.flags[0],
            error: opt,
        }),
        MsgType::Staged => Msg::Staged(Staged {
            request_id: s(0),
            data_size: n0,
            manifest: Manifest::Entries(entries),
            session_id: s(1),
            pool_ptr: n1,
            slot_offset: n2,
            scalar_fields: scalars,
        }),
        MsgType::Alloc => Msg::Alloc(Alloc {
            request_id: s(0),
            data_size: n0,
            source_role: s(1),
            receiver_session_id: s(2),
        }),
        MsgType::Allocated => Msg::Allocated(Allocated {
            request_id: s(0),
            session_id: s(1),
            pool_ptr: n0,
            slot_offset: n1,
            slot_size: n2,
        }),
        MsgType::AllocReject => Msg::AllocReject(AllocReject {
            request_id: s(0),
            session_id: s(1),
            retryable: o.flags[0],
            reason: s(2),
        }),
        MsgType::Push => Msg::Push(Push {
            request_id: s(0),
            dest_session_id: s(1),
            dest_addr: n0,
            transfer_size: n3,
        }),
        MsgType::Pushed => Msg::Pushed(Pushed {
            request_id: s(0),
            success: o.flags[1],
            error: opt,
        }),
        MsgType::Ready => Msg::Ready(Ready {
            request_id: s(0),
            manifest: Manifest::Entries(entries),
            slot_offset: n0,
            scalar_fields: scalars,
            dest_session_id: s(3),
            prealloc_slot_id: None,
        }),
        MsgType::Done => Msg::Done(Done {
            request_id: s(0),
            error: opt,
            ..Done::default()
        }),
        MsgType::Abort => Msg::Abort(Abort {
            request_id: s(0),
            reason: s(3),
            source_role: s(1),
        }),
        MsgType::Deregister => Msg::Deregister(Deregister {
            session_id: s(1),
            draining: o.flags[0],
            reason: s(3),
        }),
    }
}

fn enc(m: &Msg<'_>, style: Style) -> Vec<u8> {
    let mut buf = vec![0u8; m.encoded_len(style)];
    let n = match style {
        Style::Verbatim => m.encode(&mut buf),
        Style::Canonical => m.encode_canonical(&mut buf),
    }
    .unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// `m` as `dialect` writes it.
fn enc_dialect(m: &Msg<'_>, dialect: Dialect) -> String {
    let mut counter = Sink::new(&mut []);
    m.write_dialect(&mut counter, Style::Verbatim, dialect);
    let mut buf = vec![0u8; counter.len()];
    let mut sink = Sink::new(&mut buf);
    m.write_dialect(&mut sink, Style::Verbatim, dialect);
    let n = sink.finish().unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

#[test]
fn a_registrations_write_lifetime_goes_to_ferrys_coordinator_only_and_only_when_set() {
    let reg = |ms| {
        Msg::Register(Register {
            role: JsonStr::plain("denoiser"),
            session_id: JsonStr::plain("s"),
            work_endpoint: JsonStr::plain("tcp://d:1"),
            write_lifetime_ms: ms,
            ..Register::default()
        })
    };
    let seed = enc_dialect(&reg(6000), Dialect::Seed);
    assert!(seed.ends_with(r#","write_lifetime_ms":6000}"#), "{seed}");
    match decode(seed.as_bytes()).unwrap() {
        Msg::Register(r) => assert_eq!(r.write_lifetime_ms, 6000),
        other => panic!("{other:?}"),
    }
    // Unset, the registration is the seed's own bytes; to sglang's head
    // (which has no use for it) it is never written.
    assert!(!enc_dialect(&reg(0), Dialect::Seed).contains("write_lifetime_ms"));
    assert!(!enc_dialect(&reg(6000), Dialect::Sglang).contains("write_lifetime_ms"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_decode_encode(o in owned()) {
        let entries: Vec<TensorEntry<'_>> = o.entries.iter().map(|(f, li, off, shape, dt)| TensorEntry {
            field: JsonStr::plain(f), list_index: *li, offset: *off, shape: Shape::Dims(shape), dtype: JsonStr::plain(dt),
        }).collect();
        let msg = build(&o, &entries);
        let bytes = enc(&msg, Style::Verbatim);
        let back = decode(&bytes).unwrap();
        prop_assert_eq!(back.msg_type(), o.ty);
        // Manifests regroup entries by field, so compare them by field.
        match (&msg, &back) {
            (Msg::Staged(a), Msg::Staged(b)) => {
                prop_assert_eq!(Msg::Staged(Staged { manifest: Manifest::default(), ..*a }), Msg::Staged(Staged { manifest: Manifest::default(), ..*b }));
                check_manifest(&entries, &b.manifest)?;
            }
            (Msg::Ready(a), Msg::Ready(b)) => {
                prop_assert_eq!(Msg::Ready(Ready { manifest: Manifest::default(), ..*a }), Msg::Ready(Ready { manifest: Manifest::default(), ..*b }));
                check_manifest(&entries, &b.manifest)?;
            }
            (Msg::Staged(_) | Msg::Ready(_), _) => prop_assert!(false),
            _ => prop_assert_eq!(msg, back),
        }
        prop_assert_eq!(&enc(&back, Style::Verbatim), &bytes);
        // Canonical output is a fixed point of decode → encode_canonical.
        let canon = enc(&msg, Style::Canonical);
        // Canonical output is pure ASCII, as Python's ensure_ascii output is.
        prop_assert!(canon.is_ascii());
        let canon2 = enc(&decode(&canon).unwrap(), Style::Canonical);
        prop_assert_eq!(canon, canon2);
    }
}

fn check_manifest(sent: &[TensorEntry<'_>], got: &Manifest<'_>) -> Result<(), TestCaseError> {
    let got: Vec<TensorEntry<'_>> = got.iter().collect::<Result<_, _>>().unwrap();
    prop_assert_eq!(got.len(), sent.len());
    // Stable regrouping: the entries of each field keep their relative order.
    let mut fields: Vec<JsonStr<'_>> = Vec::new();
    for e in sent {
        if !fields.contains(&e.field) {
            fields.push(e.field);
        }
    }
    let regrouped: Vec<_> = fields
        .iter()
        .flat_map(|f| sent.iter().filter(move |e| e.field == *f))
        .copied()
        .collect();
    prop_assert_eq!(got, regrouped);
    Ok(())
}

/// Payloads near valid ones: the fast decoder and validator must agree with
/// their references on every one of them, errors included.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let base = prop::sample::select(vec![
        br#"{"msg_type":"transfer_staged","request_id":"r1","data_size":14088704,"manifest":{"latents":[{"offset":0,"shape":[1,16],"dtype":"bfloat16","list_index":0}]},"session_id":"s","pool_ptr":4096,"slot_offset":512,"scalar_fields":{"a":[1e-05,NaN,-Infinity,"x\u00e9"]}}"#.to_vec(),
        br#"{"msg_type":"transfer_push","request_id":"r1","dest_session_id":"d","dest_addr":18446744073709551615,"transfer_size":7}"#.to_vec(),
        br#"{"msg_type":"transfer_pushed","request_id":"r\"1","success":false,"error":null}"#.to_vec(),
        br#"{"msg_type":"transfer_register","role":"denoiser","preallocated_slots":[{"offset":0,"size":1,"slot_id":0,"addr":9}]}"#.to_vec(),
    ]);
    let edit = (
        any::<prop::sample::Index>(),
        prop::sample::select(b"{}[]\",:\\ -0123456789.eE+tfnNI\x00\x7f\xc3\xa9u".to_vec()),
        0u8..3,
    );
    (base, prop::collection::vec(edit, 0..6)).prop_map(|(mut b, edits)| {
        for (at, byte, op) in edits {
            let i = at.index(b.len() + 1);
            match op {
                0 => b.insert(i, byte),
                1 if i < b.len() => {
                    b.remove(i);
                }
                _ if i < b.len() => b[i] = byte,
                _ => {}
            }
        }
        b
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20000))]

    #[test]
    fn fast_paths_agree_with_references(payload in mutated()) {
        prop_assert_eq!(decode(&payload), decode_reference(&payload));
        if let Ok(text) = std::str::from_utf8(&payload) {
            prop_assert_eq!(RawJson::parse(text), RawJson::parse_precise(text));
        }
    }
}
