//! Text views of wire messages for the `ferry wire` commands: the seed's
//! canonical encoding of a payload, and a layout for people to read.

use std::fmt::Write as _;

use tensorferry_core::json::{JsonStr, RawJson};
use tensorferry_core::wire::{decode, DecodeError, Manifest, Msg, SlotList};

/// Appends to `out` the canonical encoding of `payload` (what the seed's
/// Python writes for the decoded message), or `error: <reason>`.
///
/// ```
/// let mut out = Vec::new();
/// tensorferry_cli::wire_text::canon_line(br#"{"msg_type":"transfer_done","request_id":"r\u00e9"}"#, &mut out);
/// assert_eq!(out, br#"{"msg_type":"transfer_done","request_id":"r\u00e9","error":null}"#);
/// ```
pub fn canon_line(payload: &[u8], out: &mut Vec<u8>) {
    match decode(payload) {
        Ok(msg) => {
            let start = out.len();
            out.resize(start + msg.encoded_len(Default::default()) + 64, 0);
            loop {
                match msg.encode_canonical(&mut out[start..]) {
                    Ok(n) => {
                        out.truncate(start + n);
                        break;
                    }
                    Err(e) => out.resize(start + e.needed, 0),
                }
            }
        }
        Err(e) => {
            out.extend_from_slice(b"error: ");
            out.extend_from_slice(e.to_string().as_bytes());
        }
    }
}

fn human_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{n} ({v:.2} {})", UNITS[unit])
}

fn quoted(s: JsonStr<'_>) -> String {
    format!("{s:?}")
}

fn opt_quoted(s: Option<JsonStr<'_>>) -> String {
    s.map_or_else(|| "none".to_string(), quoted)
}

struct Pretty {
    out: String,
}

impl Pretty {
    fn field(&mut self, name: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.out, "  {name:<19} {value}");
    }

    fn manifest(&mut self, m: &Manifest<'_>) -> Result<(), DecodeError> {
        let entries = m.iter().collect::<Result<Vec<_>, _>>()?;
        self.field("manifest", format!("{} tensor(s)", entries.len()));
        for e in entries {
            let name = match e.list_index {
                Some(i) => format!("{}[{i}]", e.field),
                None => e.field.to_string(),
            };
            let dims: Vec<String> = e.shape.dims().map(|d| d.to_string()).collect();
            let _ = writeln!(
                self.out,
                "    {:<30} offset {:<12} [{}] {}",
                format!("{name:?}"),
                e.offset,
                dims.join(", "),
                e.dtype
            );
        }
        Ok(())
    }

    fn slots(&mut self, s: &SlotList<'_>) -> Result<(), DecodeError> {
        let slots = s.iter().collect::<Result<Vec<_>, _>>()?;
        self.field("preallocated_slots", format!("{} slot(s)", slots.len()));
        for s in slots {
            let _ = writeln!(
                self.out,
                "    slot {:<6} offset {:<14} size {:<24} addr {:#x}",
                s.slot_id,
                s.offset,
                human_size(s.size),
                s.addr
            );
        }
        Ok(())
    }

    fn raw(&mut self, name: &str, v: RawJson<'_>) {
        self.field(name, v.as_str());
    }
}

/// A multi-line description of `payload` for a person, or the error.
pub fn pretty(payload: &[u8]) -> Result<String, DecodeError> {
    let msg = decode(payload)?;
    let mut p = Pretty {
        out: format!("{}\n", msg.msg_type()),
    };
    match msg {
        Msg::Register(m) => {
            p.field("role", quoted(m.role));
            p.field("session_id", quoted(m.session_id));
            p.field("pool_ptr", format!("{:#x}", m.pool_ptr));
            p.field("pool_size", human_size(m.pool_size));
            p.field("work_endpoint", quoted(m.work_endpoint));
            p.slots(&m.preallocated_slots)?;
        }
        Msg::RegisterAck(m) => {
            p.field("session_id", quoted(m.session_id));
            p.field("role", quoted(m.role));
            p.field("accepted", m.accepted);
            p.field("error", opt_quoted(m.error));
        }
        Msg::Staged(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("data_size", human_size(m.data_size));
            p.manifest(&m.manifest)?;
            p.field("session_id", quoted(m.session_id));
            p.field("pool_ptr", format!("{:#x}", m.pool_ptr));
            p.field("slot_offset", m.slot_offset);
            p.raw("scalar_fields", m.scalar_fields);
        }
        Msg::Alloc(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("data_size", human_size(m.data_size));
            p.field("source_role", quoted(m.source_role));
        }
        Msg::Allocated(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("session_id", quoted(m.session_id));
            p.field("pool_ptr", format!("{:#x}", m.pool_ptr));
            p.field("slot_offset", m.slot_offset);
            p.field("slot_size", human_size(m.slot_size));
        }
        Msg::AllocReject(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("session_id", quoted(m.session_id));
            p.field("retryable", m.retryable);
            p.field("reason", quoted(m.reason));
        }
        Msg::Push(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("dest_session_id", quoted(m.dest_session_id));
            p.field("dest_addr", format!("{:#x}", m.dest_addr));
            p.field("transfer_size", human_size(m.transfer_size));
        }
        Msg::Pushed(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("success", m.success);
            p.field("error", opt_quoted(m.error));
        }
        Msg::Ready(m) => {
            p.field("request_id", quoted(m.request_id));
            p.manifest(&m.manifest)?;
            p.field("slot_offset", m.slot_offset);
            p.raw("scalar_fields", m.scalar_fields);
        }
        Msg::Done(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("error", opt_quoted(m.error));
        }
        Msg::Abort(m) => {
            p.field("request_id", quoted(m.request_id));
            p.field("reason", quoted(m.reason));
        }
        Msg::Deregister(m) => {
            p.field("session_id", quoted(m.session_id));
            p.field("draining", m.draining);
            p.field("reason", quoted(m.reason));
        }
    }
    Ok(p.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canon_line_reports_errors_inline() {
        let mut out = Vec::new();
        canon_line(br#"{"msg_type":"transfer_push","dest_addr":-1}"#, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("error: field `dest_addr`: negative"),
            "{text}"
        );
    }

    #[test]
    fn canon_line_fills_defaults_and_drops_unknown_fields() {
        let mut out = Vec::new();
        canon_line(
            br#" { "zzz" : [1, NaN], "request_id" : "r\u00e9", "msg_type":"transfer_done" } "#,
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"msg_type":"transfer_done","request_id":"r\u00e9","error":null}"#
        );
    }

    #[test]
    fn pretty_shows_manifest_and_sizes() {
        let text = pretty(br#"{"msg_type":"transfer_staged","request_id":"r1","data_size":14088704,"manifest":{"latents":[{"offset":512,"shape":[1,16],"dtype":"bfloat16","list_index":0}]}}"#).unwrap();
        assert!(text.starts_with("transfer_staged\n"), "{text}");
        assert!(text.contains("14088704 (13.44 MiB)"), "{text}");
        assert!(text.contains("\"latents[0]\""), "{text}");
        assert!(text.contains("[1, 16] bfloat16"), "{text}");
        assert!(
            pretty(br#"{"msg_type":"transfer_staged","manifest":{"a":[{"offset":1}]}}"#).is_err()
        );
    }
}
