//! Arbitrary bytes into the decoder. Whatever decodes must walk, unescape and
//! re-encode without panicking, and its encodings must decode again to the
//! same message (canonical output being a fixed point).
#![no_main]

use ferry_core::wire::{decode, Msg, Style};
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
            for e in m.manifest.iter() {
                if let Ok(e) = e {
                    let _ = e.shape.elements();
                }
            }
            for kv in m.scalar_fields.members() {
                let _ = kv;
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
    let Ok(msg) = decode(data) else { return };
    walk(&msg);
    let verbatim = encode(&msg, Style::Verbatim);
    let again = decode(&verbatim).expect("verbatim encoding decodes");
    assert_eq!(encode(&again, Style::Verbatim), verbatim);
    let canon = encode(&msg, Style::Canonical);
    let back = decode(&canon).expect("canonical encoding decodes");
    assert_eq!(encode(&back, Style::Canonical), canon);
});
