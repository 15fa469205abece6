//! Arbitrary bytes into the decoder. Whatever decodes must walk, unescape and
//! re-encode without panicking, and its encodings must decode again to the
//! same message (canonical output being a fixed point). The fast paths
//! (message decoder, value validator) must agree with their references.
#![no_main]

use tensorferry_core::json::RawJson;
use tensorferry_core::wire::{decode, decode_reference, Msg, Style};
use libfuzzer_sys::fuzz_target;

fn encode(msg: &Msg<'_>, style: Style) -> Vec<u8> {
    let mut buf = vec![0u8; msg.encoded_len(style)];
    let n = match style {
        Style::Verbatim => msg.encode(&mut buf),
        Style::Canonical => msg.encode_canonical(&mut buf),
    }
    .expect("encoded_len is exact");
    assert_eq!(n, buf.len());
    buf
}

fn walk(msg: &Msg<'_>) {
    let mut scratch = [0u8; 64];
    if let Some(id) = msg.request_id() {
        let _ = id.unescape_into(&mut scratch);
        assert_eq!(
            id.chars().map(char::len_utf8).sum::<usize>(),
            id.decoded_len()
        );
    }
    match msg {
        Msg::Staged(m) => {
            for e in m.manifest.iter().flatten() {
                let _ = e.shape.elements();
            }
            for kv in m.scalar_fields.members() {
                assert!(kv.is_ok(), "members of a validated object");
            }
        }
        Msg::Ready(m) => {
            let _ = m.manifest.validate();
        }
        Msg::Register(m) => {
            let _ = m.preallocated_slots.validate();
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(
            RawJson::parse(text),
            RawJson::parse_precise(text),
            "lean vs precise validator"
        );
    }
    let decoded = decode(data);
    assert_eq!(decoded, decode_reference(data), "fast vs reference decoder");
    let Ok(msg) = decoded else { return };
    walk(&msg);
    let verbatim = encode(&msg, Style::Verbatim);
    let again = decode(&verbatim).expect("verbatim encoding decodes");
    assert_eq!(encode(&again, Style::Verbatim), verbatim);
    let canon = encode(&msg, Style::Canonical);
    let back = decode(&canon).expect("canonical encoding decodes");
    assert_eq!(encode(&back, Style::Canonical), canon);
});
