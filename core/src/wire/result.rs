//! sglang's result messages: what its role instances send the head that is
//! not a transfer message. Its tensor codec frames them as a JSON
//! descriptor (frame 0: `{"tensor_descriptors": [...], "scalar_fields":
//! {...}}`) followed by one raw frame per tensor; `scalar_fields` names
//! the request (`request_id`) and, on failure, why (`error`, or
//! `_disagg_error` from an encoder).

use super::msg::Done;
use crate::json::{JsonStr, JsonType, RawJson};

/// A role's result as the `transfer_done` it amounts to for a coordinator:
/// the request it ends and the error, if it failed. `None` for a frame
/// that is not such a descriptor (no object, no `tensor_descriptors` list,
/// no string `request_id`).
pub fn result_as_done(frame0: &[u8]) -> Option<Done<'_>> {
    let text = core::str::from_utf8(frame0).ok()?;
    let (meta, ty) = RawJson::parse(text).ok()?;
    if ty != JsonType::Object {
        return None;
    }
    let (_, descriptors) = RawJson::parse(meta.get("tensor_descriptors")?.as_str()).ok()?;
    if descriptors != JsonType::Array {
        return None;
    }
    let scalars = meta.get("scalar_fields")?;
    let request_id = string(scalars.get("request_id")?)?;
    if request_id.is_empty() {
        return None;
    }
    let error = scalars
        .get("error")
        .or_else(|| scalars.get("_disagg_error"))
        .and_then(string);
    Some(Done {
        request_id,
        error,
        ..Done::default()
    })
}

/// The string a raw JSON value is, if it is one.
fn string(v: RawJson<'_>) -> Option<JsonStr<'_>> {
    let text = v.as_str();
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    // A validated string token: its contents need unescaping only if they
    // hold a backslash.
    Some(JsonStr::from_validated(inner, inner.contains('\\')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoder_output_descriptor_reads_as_its_done() {
        let meta = br#"{"tensor_descriptors":[{"field_name":"output","shape":[2],"dtype":"uint8","list_index":-1}],"scalar_fields":{"request_id":"r\"1"}}"#;
        let d = result_as_done(meta).unwrap();
        assert!(d.request_id.eq_str("r\"1"));
        assert_eq!(d.error, None);
        let failed = br#"{"tensor_descriptors":[],"scalar_fields":{"request_id":"r2","error":"Upstream error: x"}}"#;
        let d = result_as_done(failed).unwrap();
        assert!(d.error.is_some_and(|e| e.eq_str("Upstream error: x")));
        for bad in [
            &br#"{"scalar_fields":{"request_id":"r"}}"#[..],
            br#"{"tensor_descriptors":{},"scalar_fields":{"request_id":"r"}}"#,
            br#"{"tensor_descriptors":[],"scalar_fields":{"request_id":7}}"#,
            br#"{"tensor_descriptors":[],"scalar_fields":{"request_id":""}}"#,
            br#"[1]"#,
            b"\xff",
            b"req-1",
        ] {
            assert_eq!(result_as_done(bad), None, "{:?}", core::str::from_utf8(bad));
        }
    }
}
