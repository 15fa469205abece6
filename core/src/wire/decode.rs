//! Decoding a frame-1 payload into a borrowed [`Msg`].
//!
//! Most messages take the one-pass fast path in `fast/`; everything it
//! declines comes here, to the general decoder, which is also the reference
//! the fast path is tested against. One pass over the top-level object
//! records where each known field's
//! value is (keys may come in any order, `msg_type` included); the message
//! is then built from the fields its type has. Unknown keys are validated
//! and ignored, missing keys take the seed's defaults, and a repeated key
//! keeps its last value, as Python's `json.loads` does.

use super::error::{DecodeError, DecodeErrorKind as K};
use super::manifest::Manifest;
use super::msg::*;
use super::slots::SlotList;
use super::value::{closes, read_val, resolve_key, separator, At};
use crate::json::{JsonError, JsonErrorKind, JsonStr, Lexer, RawJson};

/// Every top-level field name of every message type.
const KEYS: [&str; 26] = [
    "msg_type",
    "request_id",
    "data_size",
    "manifest",
    "session_id",
    "pool_ptr",
    "slot_offset",
    "source_role",
    "slot_size",
    "dest_session_id",
    "dest_addr",
    "transfer_size",
    "scalar_fields",
    "error",
    "role",
    "pool_size",
    "work_endpoint",
    "preallocated_slots",
    "success",
    "retryable",
    "reason",
    "accepted",
    "receiver_session_id",
    "staged_for_decoder",
    "draining",
    "write_lifetime_ms",
];

/// Index of each known key in [`KEYS`].
#[derive(Clone, Copy)]
enum Key {
    MsgType,
    RequestId,
    DataSize,
    Manifest,
    SessionId,
    PoolPtr,
    SlotOffset,
    SourceRole,
    SlotSize,
    DestSessionId,
    DestAddr,
    TransferSize,
    ScalarFields,
    Error,
    Role,
    PoolSize,
    WorkEndpoint,
    PreallocatedSlots,
    Success,
    Retryable,
    Reason,
    Accepted,
    ReceiverSessionId,
    StagedForDecoder,
    Draining,
    WriteLifetimeMs,
}

impl Key {
    fn name(self) -> &'static str {
        KEYS[self as usize]
    }
}

fn key_index(key: JsonStr<'_>) -> Option<Key> {
    let name = match key.as_plain() {
        // Hot path: a plain key; `match` compiles to length-then-bytes tests.
        Some(k) => k,
        None => resolve_key(key, &KEYS)?,
    };
    Some(match name {
        "msg_type" => Key::MsgType,
        "request_id" => Key::RequestId,
        "data_size" => Key::DataSize,
        "manifest" => Key::Manifest,
        "session_id" => Key::SessionId,
        "pool_ptr" => Key::PoolPtr,
        "slot_offset" => Key::SlotOffset,
        "source_role" => Key::SourceRole,
        "slot_size" => Key::SlotSize,
        "dest_session_id" => Key::DestSessionId,
        "dest_addr" => Key::DestAddr,
        "transfer_size" => Key::TransferSize,
        "scalar_fields" => Key::ScalarFields,
        "error" => Key::Error,
        "role" => Key::Role,
        "pool_size" => Key::PoolSize,
        "work_endpoint" => Key::WorkEndpoint,
        "preallocated_slots" => Key::PreallocatedSlots,
        "success" => Key::Success,
        "retryable" => Key::Retryable,
        "reason" => Key::Reason,
        "accepted" => Key::Accepted,
        "receiver_session_id" => Key::ReceiverSessionId,
        "staged_for_decoder" => Key::StagedForDecoder,
        "draining" => Key::Draining,
        "write_lifetime_ms" => Key::WriteLifetimeMs,
        _ => return None,
    })
}

/// The values seen for each known key.
struct Fields<'a>([Option<At<'a>>; KEYS.len()]);

impl<'a> Fields<'a> {
    fn get(&self, key: Key) -> Option<&At<'a>> {
        self.0[key as usize].as_ref()
    }

    fn str(&self, key: Key) -> Result<JsonStr<'a>, DecodeError> {
        self.get(key)
            .map_or(Ok(JsonStr::EMPTY), |v| v.str(key.name()))
    }

    fn opt_str(&self, key: Key) -> Result<Option<JsonStr<'a>>, DecodeError> {
        self.get(key).map_or(Ok(None), |v| v.opt_str(key.name()))
    }

    fn u64(&self, key: Key) -> Result<u64, DecodeError> {
        self.get(key).map_or(Ok(0), |v| v.u64(key.name()))
    }

    fn bool(&self, key: Key, default: bool) -> Result<bool, DecodeError> {
        self.get(key).map_or(Ok(default), |v| v.bool(key.name()))
    }

    fn object(&self, key: Key) -> Result<RawJson<'a>, DecodeError> {
        self.get(key)
            .map_or(Ok(RawJson::EMPTY_OBJECT), |v| v.object(key.name()))
    }

    fn manifest(&self) -> Result<Manifest<'a>, DecodeError> {
        self.object(Key::Manifest).map(Manifest::Raw)
    }

    fn slots(&self) -> Result<SlotList<'a>, DecodeError> {
        let key = Key::PreallocatedSlots;
        self.get(key).map_or(Ok(SlotList::Slots(&[])), |v| {
            v.array(key.name()).map(SlotList::Raw)
        })
    }
}

/// Decodes a transfer message payload (frame 1), borrowing from it.
///
/// Accepts any valid JSON object in any key order and whitespace, plus
/// CPython's `NaN`/`Infinity` inside nested values and a leading UTF-8 BOM
/// (which `json.loads` of bytes also skips). Never panics; every rejection
/// names the field and the byte.
pub fn decode(payload: &[u8]) -> Result<Msg<'_>, DecodeError> {
    let text = utf8(payload)?;
    match super::fast::decode(text) {
        Some(msg) => Ok(msg),
        None => decode_text(text),
    }
}

/// The general decoder alone, without the fast path: the reference the
/// fast path is tested (and fuzzed) against.
#[doc(hidden)]
pub fn decode_reference(payload: &[u8]) -> Result<Msg<'_>, DecodeError> {
    decode_text(utf8(payload)?)
}

fn utf8(payload: &[u8]) -> Result<&str, DecodeError> {
    let payload = payload.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(payload);
    core::str::from_utf8(payload)
        .map_err(|e| DecodeError::new(K::Json(JsonErrorKind::NotUtf8), None, e.valid_up_to()))
}

fn decode_text(text: &str) -> Result<Msg<'_>, DecodeError> {
    let fields = scan(text)?;
    build(&fields)
}

fn scan(text: &str) -> Result<Fields<'_>, DecodeError> {
    let mut lx = Lexer::new(text);
    let mut fields = Fields([None; KEYS.len()]);
    lx.skip_ws();
    if lx.peek() != Some(b'{') {
        // Valid JSON of another type is "not an object"; anything else is a
        // syntax error.
        let (_, ty) = lx.value()?;
        lx.finish()?;
        return Err(DecodeError::new(K::NotAnObject(ty), None, 0));
    }
    lx.bump();
    if !closes(&mut lx, b'}') {
        loop {
            let key = lx.key()?;
            let v = read_val(&mut lx)?;
            if let Some(i) = key_index(key) {
                fields.0[i as usize] = Some(v);
            }
            match separator(&mut lx, b'}') {
                Some(true) => {}
                Some(false) => break,
                None => return Err(unexpected(&lx)),
            }
        }
    }
    lx.finish()?;
    Ok(fields)
}

/// What stands where a top-level `,` or `}` must.
fn unexpected(lx: &Lexer<'_>) -> DecodeError {
    match lx.peek() {
        Some(found) => JsonError {
            kind: JsonErrorKind::UnexpectedByte {
                found,
                expected: "',' or '}'",
            },
            at: lx.pos(),
        }
        .into(),
        None => lx.err(JsonErrorKind::UnexpectedEnd).into(),
    }
}

fn build<'a>(f: &Fields<'a>) -> Result<Msg<'a>, DecodeError> {
    let ty = match f.get(Key::MsgType) {
        None => return Err(DecodeError::new(K::MissingMsgType, Some("msg_type"), 0)),
        Some(v) => {
            let name = v.str("msg_type")?;
            let ty = match name.as_plain() {
                Some(n) => MsgType::from_name(n),
                None => MsgType::ALL.into_iter().find(|t| name.eq_str(t.as_str())),
            };
            ty.ok_or(DecodeError::new(K::UnknownMsgType, Some("msg_type"), v.at))?
        }
    };
    Ok(match ty {
        MsgType::Register => Msg::Register(Register {
            role: f.str(Key::Role)?,
            session_id: f.str(Key::SessionId)?,
            pool_ptr: f.u64(Key::PoolPtr)?,
            pool_size: f.u64(Key::PoolSize)?,
            work_endpoint: f.str(Key::WorkEndpoint)?,
            preallocated_slots: f.slots()?,
            write_lifetime_ms: f.u64(Key::WriteLifetimeMs)?,
        }),
        MsgType::RegisterAck => Msg::RegisterAck(RegisterAck {
            session_id: f.str(Key::SessionId)?,
            role: f.str(Key::Role)?,
            accepted: f.bool(Key::Accepted, true)?,
            error: f.opt_str(Key::Error)?,
        }),
        MsgType::Staged => Msg::Staged(Staged {
            request_id: f.str(Key::RequestId)?,
            data_size: f.u64(Key::DataSize)?,
            manifest: f.manifest()?,
            session_id: f.str(Key::SessionId)?,
            pool_ptr: f.u64(Key::PoolPtr)?,
            slot_offset: f.u64(Key::SlotOffset)?,
            scalar_fields: f.object(Key::ScalarFields)?,
        }),
        MsgType::Alloc => Msg::Alloc(Alloc {
            request_id: f.str(Key::RequestId)?,
            data_size: f.u64(Key::DataSize)?,
            source_role: f.str(Key::SourceRole)?,
            receiver_session_id: f.str(Key::ReceiverSessionId)?,
        }),
        MsgType::Allocated => Msg::Allocated(Allocated {
            request_id: f.str(Key::RequestId)?,
            session_id: f.str(Key::SessionId)?,
            pool_ptr: f.u64(Key::PoolPtr)?,
            slot_offset: f.u64(Key::SlotOffset)?,
            slot_size: f.u64(Key::SlotSize)?,
        }),
        MsgType::AllocReject => Msg::AllocReject(AllocReject {
            request_id: f.str(Key::RequestId)?,
            session_id: f.str(Key::SessionId)?,
            retryable: f.bool(Key::Retryable, true)?,
            reason: f.str(Key::Reason)?,
        }),
        MsgType::Push => Msg::Push(Push {
            request_id: f.str(Key::RequestId)?,
            dest_session_id: f.str(Key::DestSessionId)?,
            dest_addr: f.u64(Key::DestAddr)?,
            transfer_size: f.u64(Key::TransferSize)?,
        }),
        MsgType::Pushed => Msg::Pushed(Pushed {
            request_id: f.str(Key::RequestId)?,
            success: f.bool(Key::Success, true)?,
            error: f.opt_str(Key::Error)?,
        }),
        MsgType::Ready => Msg::Ready(Ready {
            request_id: f.str(Key::RequestId)?,
            manifest: f.manifest()?,
            slot_offset: f.u64(Key::SlotOffset)?,
            scalar_fields: f.object(Key::ScalarFields)?,
            dest_session_id: f.str(Key::DestSessionId)?,
            prealloc_slot_id: None,
        }),
        MsgType::Done => Msg::Done(Done {
            request_id: f.str(Key::RequestId)?,
            error: f.opt_str(Key::Error)?,
            staged_for_decoder: f.bool(Key::StagedForDecoder, false)?,
            session_id: f.str(Key::SessionId)?,
            pool_ptr: f.u64(Key::PoolPtr)?,
            slot_offset: f.u64(Key::SlotOffset)?,
            data_size: f.u64(Key::DataSize)?,
            manifest: f.manifest()?,
            scalar_fields: f.object(Key::ScalarFields)?,
        }),
        MsgType::Abort => Msg::Abort(Abort {
            request_id: f.str(Key::RequestId)?,
            reason: f.str(Key::Reason)?,
            source_role: f.str(Key::SourceRole)?,
        }),
        MsgType::Deregister => Msg::Deregister(Deregister {
            session_id: f.str(Key::SessionId)?,
            draining: f.bool(Key::Draining, false)?,
            reason: f.str(Key::Reason)?,
        }),
    })
}
