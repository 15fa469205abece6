//! Every malformed payload gets a typed error that names the field and the
//! reason, and never a panic.

use tensorferry_core::json::{JsonErrorKind as J, JsonType, MAX_DEPTH};
use tensorferry_core::wire::{decode, DecodeError, DecodeErrorKind as K, Msg};

fn err(payload: &str) -> DecodeError {
    match decode(payload.as_bytes()) {
        Ok(m) => panic!("decoded {m:?} from {payload}"),
        Err(e) => e,
    }
}

fn json_kind(payload: &str) -> J {
    match err(payload).kind {
        K::Json(k) => k,
        other => panic!("{payload}: {other:?}"),
    }
}

#[test]
fn not_json() {
    assert!(matches!(
        json_kind("hello"),
        J::UnexpectedByte { found: b'h', .. }
    ));
    assert_eq!(json_kind(""), J::UnexpectedEnd);
    assert_eq!(
        json_kind("{\"msg_type\":\"transfer_done\""),
        J::UnexpectedEnd
    );
    assert!(matches!(
        json_kind("{'msg_type':1}"),
        J::UnexpectedByte { found: b'\'', .. }
    ));
    assert!(matches!(
        json_kind("{\"a\":1,}"),
        J::UnexpectedByte { found: b'}', .. }
    ));
    assert!(matches!(
        json_kind("{\"a\" 1}"),
        J::UnexpectedByte { found: b'1', .. }
    ));
    assert!(matches!(json_kind("{\"a\":tru}"), J::UnexpectedByte { .. }));
    assert!(matches!(
        json_kind("{\"a\":[1 2]}"),
        J::UnexpectedByte { found: b'2', .. }
    ));
}

#[test]
fn not_an_object() {
    assert_eq!(err("[1,2]").kind, K::NotAnObject(JsonType::Array));
    assert_eq!(
        err(" \"transfer_done\" ").kind,
        K::NotAnObject(JsonType::String)
    );
    assert_eq!(err("null").kind, K::NotAnObject(JsonType::Null));
}

#[test]
fn trailing_bytes() {
    let e = err("{\"msg_type\":\"transfer_done\"} x");
    assert_eq!(e.kind, K::Json(J::TrailingBytes));
    assert_eq!(e.at, 29);
    assert_eq!(json_kind("{}{}"), J::TrailingBytes);
}

#[test]
fn msg_type_missing_unknown_or_mistyped() {
    assert_eq!(err("{}").kind, K::MissingMsgType);
    assert_eq!(err("{\"request_id\":\"r\"}").kind, K::MissingMsgType);
    let e = err("{\"msg_type\":\"transfer_teleport\"}");
    assert_eq!((e.kind, e.field), (K::UnknownMsgType, Some("msg_type")));
    let e = err("{\"msg_type\":7}");
    assert_eq!(e.field, Some("msg_type"));
    assert!(matches!(
        e.kind,
        K::WrongType {
            found: JsonType::Number,
            ..
        }
    ));
}

#[test]
fn integers_that_are_addresses_or_sizes() {
    let cases = [
        ("-1", K::NegativeInteger),
        ("-18446744073709551616", K::NegativeInteger),
        ("18446744073709551616", K::IntegerTooLarge),
        ("99999999999999999999999999", K::IntegerTooLarge),
        ("1.0", K::NotAnInteger),
        ("1e3", K::NotAnInteger),
        ("NaN", K::NotAnInteger),
        ("-Infinity", K::NotAnInteger),
    ];
    for (v, kind) in cases {
        let e = err(&format!(
            "{{\"msg_type\":\"transfer_push\",\"dest_addr\":{v}}}"
        ));
        assert_eq!((e.kind, e.field), (kind, Some("dest_addr")), "{v}");
    }
    for v in ["\"12\"", "true", "null", "[1]", "{}"] {
        let e = err(&format!(
            "{{\"msg_type\":\"transfer_staged\",\"data_size\":{v}}}"
        ));
        assert_eq!(e.field, Some("data_size"), "{v}");
        assert!(matches!(e.kind, K::WrongType { .. }), "{v}: {:?}", e.kind);
    }
    // Largest value and negative zero are fine.
    let m = decode(
        b"{\"msg_type\":\"transfer_push\",\"dest_addr\":18446744073709551615,\"transfer_size\":-0}",
    )
    .unwrap();
    let Msg::Push(p) = m else { panic!() };
    assert_eq!((p.dest_addr, p.transfer_size), (u64::MAX, 0));
}

#[test]
fn wrong_types_name_the_field() {
    // (type, field, a value of the wrong type for it)
    let cases = [
        ("transfer_staged", "request_id", "5"),
        ("transfer_staged", "manifest", "[]"),
        ("transfer_staged", "scalar_fields", "\"x\""),
        ("transfer_ready", "scalar_fields", "[]"),
        ("transfer_register", "preallocated_slots", "{}"),
        ("transfer_register", "preallocated_slots", "null"),
        ("transfer_pushed", "success", "1"),
        ("transfer_pushed", "error", "false"),
        ("transfer_done", "error", "{}"),
        ("transfer_alloc_reject", "retryable", "\"yes\""),
        ("transfer_register_ack", "accepted", "null"),
    ];
    for (ty, field, value) in cases {
        let member = format!("\"{field}\":{value}");
        let e = err(&format!("{{\"msg_type\":\"{ty}\",{member}}}"));
        assert_eq!(e.field, Some(field), "{ty} {member}");
        assert!(matches!(e.kind, K::WrongType { .. }), "{ty} {member}: {e}");
        assert!(e.to_string().contains(field));
    }
}

#[test]
fn fields_of_other_types_are_ignored() {
    // `manifest` is not a field of transfer_push: its type does not matter.
    assert!(decode(b"{\"msg_type\":\"transfer_push\",\"manifest\":5,\"success\":\"no\"}").is_ok());
}

#[test]
fn bad_strings() {
    // Each `request_id` value, and the error it is.
    for (value, kind) in [
        (r#""\x""#, J::InvalidEscape),
        (r#""\u12G4""#, J::InvalidEscape),
        (r#""\u12""#, J::InvalidEscape),
        (r#""\ud800""#, J::LoneSurrogate),
        (r#""\udc00\ud800""#, J::LoneSurrogate),
        (r#""\ud800\u0041""#, J::LoneSurrogate),
        ("\"a\nb\"", J::ControlCharInString),
    ] {
        let payload = format!(r#"{{"msg_type":"transfer_done","request_id":{value}}}"#);
        assert_eq!(json_kind(&payload), kind, "{payload}");
    }
    assert_eq!(
        json_kind("{\"msg_type\":\"transfer_done\",\"request_id\":\"abc"),
        J::UnexpectedEnd
    );
    let mut bytes = b"{\"msg_type\":\"transfer_done\",\"request_id\":\"\xff\"}".to_vec();
    assert_eq!(decode(&bytes).unwrap_err().kind, K::Json(J::NotUtf8));
    bytes[43] = 0xc3; // a truncated two-byte sequence
    assert_eq!(decode(&bytes).unwrap_err().kind, K::Json(J::NotUtf8));
}

#[test]
fn bad_numbers() {
    for n in [
        "01", "1.", ".5", "-", "1e", "1e+", "+1", "0x10", "--1", "Inf", "nan",
    ] {
        let e = decode(
            format!("{{\"msg_type\":\"transfer_ready\",\"scalar_fields\":{{\"x\":{n}}}}}")
                .as_bytes(),
        )
        .unwrap_err();
        assert!(matches!(e.kind, K::Json(_)), "{n}: {e}");
    }
}

#[test]
fn nesting_is_bounded_without_recursion() {
    let ok = format!(
        "{{\"msg_type\":\"transfer_ready\",\"scalar_fields\":{}{}}}",
        "[".repeat(MAX_DEPTH - 1),
        "]".repeat(MAX_DEPTH - 1)
    );
    // scalar_fields must be an object: the array is well-formed but mistyped.
    assert!(matches!(err(&ok).kind, K::WrongType { .. }));
    let fits = format!(
        "{{\"msg_type\":\"transfer_ready\",\"scalar_fields\":{{\"a\":{}{}}}}}",
        "[".repeat(MAX_DEPTH - 1),
        "]".repeat(MAX_DEPTH - 1)
    );
    assert!(decode(fits.as_bytes()).is_ok());
    let deep = format!(
        "{{\"msg_type\":\"transfer_ready\",\"scalar_fields\":{{\"a\":{}{}}}}}",
        "[".repeat(MAX_DEPTH),
        "]".repeat(MAX_DEPTH)
    );
    assert_eq!(json_kind(&deep), J::TooDeep);
    // A hostile peer's million brackets are rejected, not a stack overflow.
    let hostile = format!(
        "{{\"msg_type\":\"transfer_ready\",\"x\":{}",
        "[{\"a\":".repeat(1_000_000)
    );
    assert_eq!(json_kind(&hostile), J::TooDeep);
}

#[test]
fn bad_manifest_entries_are_typed_errors_on_iteration() {
    let cases = [
        (
            r#"{"f":[{"shape":[1],"dtype":"int8"}]}"#,
            "manifest.offset",
            K::MissingField,
        ),
        (
            r#"{"f":[{"offset":0,"dtype":"int8"}]}"#,
            "manifest.shape",
            K::MissingField,
        ),
        (
            r#"{"f":[{"offset":0,"shape":[1]}]}"#,
            "manifest.dtype",
            K::MissingField,
        ),
        (
            r#"{"f":[{"offset":-512,"shape":[1],"dtype":"int8"}]}"#,
            "manifest.offset",
            K::NegativeInteger,
        ),
        (
            r#"{"f":[{"offset":0,"shape":[1,-2],"dtype":"int8"}]}"#,
            "manifest.shape",
            K::NegativeInteger,
        ),
        (
            r#"{"f":[{"offset":0,"shape":[1.5],"dtype":"int8"}]}"#,
            "manifest.shape",
            K::NotAnInteger,
        ),
        (
            r#"{"f":[{"offset":0,"shape":[1],"dtype":"int8","list_index":-1}]}"#,
            "manifest.list_index",
            K::NegativeInteger,
        ),
    ];
    for (manifest, field, kind) in cases {
        let payload = format!("{{\"msg_type\":\"transfer_ready\",\"manifest\":{manifest}}}");
        let Msg::Ready(r) = decode(payload.as_bytes()).unwrap() else {
            panic!()
        };
        let e = r.manifest.validate().unwrap_err();
        assert_eq!((e.field, e.kind), (Some(field), kind), "{manifest}");
    }
    for manifest in [r#"{"f":5}"#, r#"{"f":[5]}"#, r#"{"f":"x"}"#] {
        let payload = format!("{{\"msg_type\":\"transfer_ready\",\"manifest\":{manifest}}}");
        let Msg::Ready(r) = decode(payload.as_bytes()).unwrap() else {
            panic!()
        };
        let e = r.manifest.validate().unwrap_err();
        assert!(matches!(e.kind, K::WrongType { .. }), "{manifest}: {e}");
    }
    // An error stops the iteration; entries before it are still yielded.
    let payload = r#"{"msg_type":"transfer_ready","manifest":{"a":[{"offset":0,"shape":[],"dtype":"int8"},7],"b":[]}}"#;
    let Msg::Ready(r) = decode(payload.as_bytes()).unwrap() else {
        panic!()
    };
    let items: Vec<_> = r.manifest.iter().collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_ok() && items[1].is_err());
}

#[test]
fn bad_preallocated_slots() {
    // A list of one good slot, but for `member`: set to `value`, or left
    // out.
    let spoiled = |member: &str, value: Option<&str>| {
        let good = [
            ("offset", "0"),
            ("size", "1"),
            ("slot_id", "0"),
            ("addr", "0"),
        ];
        let members: Vec<String> = good
            .into_iter()
            .filter_map(|(m, v)| {
                let v = if m == member { value? } else { v };
                Some(format!("\"{m}\":{v}"))
            })
            .collect();
        format!("[{{{}}}]", members.join(","))
    };
    // (the member, its value, the error)
    let cases = [
        ("addr", None, K::MissingField),
        ("size", Some("-1"), K::NegativeInteger),
        ("addr", Some("18446744073709551616"), K::IntegerTooLarge),
    ];
    for (member, value, kind) in cases {
        let slots = spoiled(member, value);
        let field = format!("preallocated_slots.{member}");
        let payload =
            format!("{{\"msg_type\":\"transfer_register\",\"preallocated_slots\":{slots}}}");
        let Msg::Register(r) = decode(payload.as_bytes()).unwrap() else {
            panic!()
        };
        let e = r.preallocated_slots.validate().unwrap_err();
        assert_eq!((e.field, e.kind), (Some(&field[..]), kind), "{slots}");
    }
    let payload = r#"{"msg_type":"transfer_register","preallocated_slots":[1]}"#;
    let Msg::Register(r) = decode(payload.as_bytes()).unwrap() else {
        panic!()
    };
    assert!(matches!(
        r.preallocated_slots.validate().unwrap_err().kind,
        K::WrongType { .. }
    ));
}

#[test]
fn duplicate_keys_keep_the_last_value_like_python() {
    let m = decode(br#"{"msg_type":"transfer_done","request_id":5,"request_id":"r2"}"#).unwrap();
    assert_eq!(m.request_id().unwrap(), "r2");
    let m = decode(br#"{"msg_type":"transfer_teleport","msg_type":"transfer_abort"}"#).unwrap();
    assert_eq!(m.msg_type(), tensorferry_core::wire::MsgType::Abort);
}

#[test]
fn escaped_strings_unescape_only_on_request() {
    let m =
        decode(br#"{"msg_type":"transfer_done","request_id":"r\u00e9\ud83d\ude00\n"}"#).unwrap();
    let id = m.request_id().unwrap();
    assert!(id.is_escaped());
    assert_eq!(id.as_plain(), None);
    assert_eq!(id.raw(), r"r\u00e9\ud83d\ude00\n");
    let mut small = [0u8; 4];
    assert_eq!(id.unescape_into(&mut small).unwrap_err().needed, 8);
    let mut buf = [0u8; 16];
    assert_eq!(id.unescape_into(&mut buf).unwrap(), "ré😀\n");
    assert_eq!(id, "ré😀\n");
    let plain = decode(br#"{"msg_type":"transfer_done","request_id":"r1"}"#).unwrap();
    assert_eq!(plain.request_id().unwrap().as_plain(), Some("r1"));
}

#[test]
fn encoder_reports_the_size_it_needs() {
    let m = decode(br#"{"msg_type":"transfer_done","request_id":"r1","error":null}"#).unwrap();
    let want = br#"{"msg_type":"transfer_done","request_id":"r1","error":null}"#;
    for cap in 0..want.len() {
        let mut buf = vec![0u8; cap];
        assert_eq!(m.encode(&mut buf).unwrap_err().needed, want.len());
    }
    let mut buf = vec![0u8; want.len()];
    assert_eq!(m.encode(&mut buf), Ok(want.len()));
    assert_eq!(&buf, want);
}
