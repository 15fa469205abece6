//! The decoder's fast path for the common shape of a message: `msg_type`
//! first, keys and strings without escapes, every known field well typed.
//! It reads with the lexer's lean position-based scanners and assigns fields
//! as it goes, in one pass, with no table.
//!
//! It answers `None` for anything else (a type error, an escape, a late or
//! repeated `msg_type`, a syntax error), and the general decoder then
//! decides, so errors and Python's last-key-wins rule have exactly one
//! implementation. When it answers `Some`, every occurrence of every known
//! field was well typed, so assigning in order is last-key-wins.

use super::manifest::Manifest;
use super::msg::*;
use super::slots::SlotList;
use crate::json::lex::{scan_number, skim, skim_string, skip_ws_at};
use crate::json::number::parse_u64;
use crate::json::{JsonStr, JsonType, NumberToken, RawJson};

/// A member value as the fast path reads it.
#[derive(Clone, Copy)]
enum V<'a> {
    Str(&'a str),
    Num(NumberToken<'a>),
    Bool(bool),
    Null,
    Raw(RawJson<'a>, JsonType),
}

/// Reads the value at `p` (no leading whitespace): the value and its end.
#[inline]
fn value(text: &str, p: usize) -> Option<(V<'_>, usize)> {
    let b = text.as_bytes();
    match *b.get(p)? {
        b'"' => {
            let end = skim_string(b, p)?;
            Some((V::Str(text.get(p + 1..end - 1)?), end))
        }
        b'0'..=b'9' | b'-' if !b[p..].starts_with(b"-I") => {
            let (end, is_integer) = scan_number(b, p).ok()?;
            let tok = NumberToken {
                text: text.get(p..end)?,
                is_integer,
            };
            Some((V::Num(tok), end))
        }
        _ => {
            let (end, ty) = skim(b, p)?;
            let raw = text.get(p..end)?;
            let v = match raw {
                "true" => V::Bool(true),
                "false" => V::Bool(false),
                "null" => V::Null,
                _ => V::Raw(RawJson::from_validated(raw), ty),
            };
            Some((v, end))
        }
    }
}

pub(super) fn decode(text: &str) -> Option<Msg<'_>> {
    let b = text.as_bytes();
    let mut p = skip_ws_at(b, 0);
    if b.get(p) != Some(&b'{') {
        return None;
    }
    let mut msg: Option<Msg<'_>> = None;
    loop {
        // A member: "key" : value
        p = skip_ws_at(b, p + 1);
        if b.get(p) != Some(&b'"') {
            return None;
        }
        let key_end = skim_string(b, p)?;
        let key = text.get(p + 1..key_end - 1)?;
        p = skip_ws_at(b, key_end);
        if b.get(p) != Some(&b':') {
            return None;
        }
        p = skip_ws_at(b, p + 1);
        let (v, end) = value(text, p)?;
        p = end;
        match (&mut msg, key) {
            (None, "msg_type") => match v {
                V::Str(name) => msg = Some(empty(MsgType::from_name(name)?)),
                _ => return None,
            },
            (None, _) | (Some(_), "msg_type") => return None,
            (Some(m), _) => assign(m, key, v)?,
        }
        p = skip_ws_at(b, p);
        match b.get(p)? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    // Only whitespace may follow.
    (skip_ws_at(b, p + 1) == b.len()).then_some(())?;
    msg
}

fn empty(ty: MsgType) -> Msg<'static> {
    match ty {
        MsgType::Register => Msg::Register(Register::default()),
        MsgType::RegisterAck => Msg::RegisterAck(RegisterAck::default()),
        MsgType::Staged => Msg::Staged(Staged::default()),
        MsgType::Alloc => Msg::Alloc(Alloc::default()),
        MsgType::Allocated => Msg::Allocated(Allocated::default()),
        MsgType::AllocReject => Msg::AllocReject(AllocReject::default()),
        MsgType::Push => Msg::Push(Push::default()),
        MsgType::Pushed => Msg::Pushed(Pushed::default()),
        MsgType::Ready => Msg::Ready(Ready::default()),
        MsgType::Done => Msg::Done(Done::default()),
        MsgType::Abort => Msg::Abort(Abort::default()),
        MsgType::Deregister => Msg::Deregister(Deregister::default()),
    }
}

#[inline]
fn s(v: V<'_>) -> Option<JsonStr<'_>> {
    match v {
        V::Str(s) => Some(JsonStr::plain(s)),
        _ => None,
    }
}

#[inline]
fn opt_s(v: V<'_>) -> Option<Option<JsonStr<'_>>> {
    match v {
        V::Str(s) => Some(Some(JsonStr::plain(s))),
        V::Null => Some(None),
        _ => None,
    }
}

#[inline]
fn n(v: V<'_>) -> Option<u64> {
    match v {
        V::Num(tok) => parse_u64(tok).ok(),
        _ => None,
    }
}

#[inline]
fn b(v: V<'_>) -> Option<bool> {
    match v {
        V::Bool(b) => Some(b),
        _ => None,
    }
}

/// An object; `null` reads as `{}`, as in the general decoder.
#[inline]
fn obj(v: V<'_>) -> Option<RawJson<'_>> {
    match v {
        V::Raw(raw, JsonType::Object) => Some(raw),
        V::Null => Some(RawJson::EMPTY_OBJECT),
        _ => None,
    }
}

#[inline]
fn arr(v: V<'_>) -> Option<RawJson<'_>> {
    match v {
        V::Raw(raw, JsonType::Array) => Some(raw),
        _ => None,
    }
}

/// Sets the field `key` of `msg` from `v`; `None` if the type is wrong.
/// Keys the message type does not have are ignored (their value was
/// validated when it was read).
fn assign<'a>(msg: &mut Msg<'a>, key: &str, v: V<'a>) -> Option<()> {
    match msg {
        Msg::Register(m) => match key {
            "role" => m.role = s(v)?,
            "session_id" => m.session_id = s(v)?,
            "pool_ptr" => m.pool_ptr = n(v)?,
            "pool_size" => m.pool_size = n(v)?,
            "work_endpoint" => m.work_endpoint = s(v)?,
            "preallocated_slots" => m.preallocated_slots = SlotList::Raw(arr(v)?),
            "write_lifetime_ms" => m.write_lifetime_ms = n(v)?,
            _ => {}
        },
        Msg::RegisterAck(m) => match key {
            "session_id" => m.session_id = s(v)?,
            "role" => m.role = s(v)?,
            "accepted" => m.accepted = b(v)?,
            "error" => m.error = opt_s(v)?,
            _ => {}
        },
        Msg::Staged(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "data_size" => m.data_size = n(v)?,
            "manifest" => m.manifest = Manifest::Raw(obj(v)?),
            "session_id" => m.session_id = s(v)?,
            "pool_ptr" => m.pool_ptr = n(v)?,
            "slot_offset" => m.slot_offset = n(v)?,
            "scalar_fields" => m.scalar_fields = obj(v)?,
            _ => {}
        },
        Msg::Alloc(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "data_size" => m.data_size = n(v)?,
            "source_role" => m.source_role = s(v)?,
            "receiver_session_id" => m.receiver_session_id = s(v)?,
            _ => {}
        },
        Msg::Allocated(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "session_id" => m.session_id = s(v)?,
            "pool_ptr" => m.pool_ptr = n(v)?,
            "slot_offset" => m.slot_offset = n(v)?,
            "slot_size" => m.slot_size = n(v)?,
            _ => {}
        },
        Msg::AllocReject(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "session_id" => m.session_id = s(v)?,
            "retryable" => m.retryable = b(v)?,
            "reason" => m.reason = s(v)?,
            _ => {}
        },
        Msg::Push(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "dest_session_id" => m.dest_session_id = s(v)?,
            "dest_addr" => m.dest_addr = n(v)?,
            "transfer_size" => m.transfer_size = n(v)?,
            _ => {}
        },
        Msg::Pushed(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "success" => m.success = b(v)?,
            "error" => m.error = opt_s(v)?,
            _ => {}
        },
        Msg::Ready(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "manifest" => m.manifest = Manifest::Raw(obj(v)?),
            "slot_offset" => m.slot_offset = n(v)?,
            "scalar_fields" => m.scalar_fields = obj(v)?,
            "dest_session_id" => m.dest_session_id = s(v)?,
            _ => {}
        },
        Msg::Done(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "error" => m.error = opt_s(v)?,
            "staged_for_decoder" => m.staged_for_decoder = b(v)?,
            "session_id" => m.session_id = s(v)?,
            "pool_ptr" => m.pool_ptr = n(v)?,
            "slot_offset" => m.slot_offset = n(v)?,
            "data_size" => m.data_size = n(v)?,
            "manifest" => m.manifest = Manifest::Raw(obj(v)?),
            "scalar_fields" => m.scalar_fields = obj(v)?,
            _ => {}
        },
        Msg::Abort(m) => match key {
            "request_id" => m.request_id = s(v)?,
            "reason" => m.reason = s(v)?,
            "source_role" => m.source_role = s(v)?,
            _ => {}
        },
        Msg::Deregister(m) => match key {
            "session_id" => m.session_id = s(v)?,
            "draining" => m.draining = b(v)?,
            "reason" => m.reason = s(v)?,
            _ => {}
        },
    }
    Some(())
}
