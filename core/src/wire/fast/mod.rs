//! The decoder's fast path for the common shape of a message: `msg_type`
//! first, keys and strings without escapes, every known field well typed.
//! It reads in one pass and writes each value straight into its field.
//!
//! Keys are predicted: a message's fields usually come in the order the
//! seed's encoder writes them (`fields.rs`), so the next expected key is
//! checked with one fixed-length compare of `"key":`, and only a miss
//! reads the key and looks it up. Each known field's value is read by a
//! reader for its type (`read.rs`), so an integer is parsed as it is
//! scanned and a string is found with one word-at-a-time scan.
//!
//! It answers `None` for anything else (a type error, an escape, a late or
//! repeated `msg_type`, a syntax error), and the general decoder then
//! decides, so errors and Python's last-key-wins rule have exactly one
//! implementation. When it answers `Some`, every occurrence of every known
//! field was well typed, so assigning in order is last-key-wins.

mod fields;
mod read;

use super::msg::*;
use crate::json::lex::skip_ws_at;
use crate::json::skim::skim;
use fields::Fill;
use read::{key_at, str_at};

/// The first member's key as the seed writes it.
const MSG_TYPE: &[u8] = b"\"msg_type\":";

/// True if `b` continues at `p` with `pat`: a key's pattern is 7 to 22
/// bytes long, compared as overlapping words rather than by a call to
/// `memcmp`.
#[inline(always)]
fn at(b: &[u8], p: usize, pat: &[u8]) -> bool {
    let n = pat.len();
    let Some(s) = b.get(p..p + n) else {
        return false;
    };
    let word = |x: &[u8], i: usize| {
        let mut w = [0u8; 8];
        if let Some(c) = x.get(i..i + 8) {
            w.copy_from_slice(c);
        }
        u64::from_le_bytes(w)
    };
    let same = |i: usize| word(s, i) == word(pat, i);
    match n {
        8..=16 => same(0) && same(n - 8),
        17..=24 => same(0) && same(8) && same(n - 8),
        _ => s == pat,
    }
}

/// Decodes `text` if it has the common shape; `None` leaves it to the
/// general decoder.
#[inline(always)]
pub(super) fn decode(text: &str) -> Option<Msg<'_>> {
    let b = text.as_bytes();
    let mut p = skip_ws_at(b, 0);
    if b.get(p) != Some(&b'{') {
        return None;
    }
    p = skip_ws_at(b, p + 1);
    // `msg_type` must come first: the fields to expect depend on it.
    p = if at(b, p, MSG_TYPE) {
        p + MSG_TYPE.len()
    } else {
        match key_at(text, p)? {
            ("msg_type", after) => after,
            _ => return None,
        }
    };
    let (name, p) = str_at(text, skip_ws_at(b, p))?;
    Some(match MsgType::from_name(name.as_plain()?)? {
        MsgType::Register => Msg::Register(members(text, p)?),
        MsgType::RegisterAck => Msg::RegisterAck(members(text, p)?),
        MsgType::Staged => Msg::Staged(members(text, p)?),
        MsgType::Alloc => Msg::Alloc(members(text, p)?),
        MsgType::Allocated => Msg::Allocated(members(text, p)?),
        MsgType::AllocReject => Msg::AllocReject(members(text, p)?),
        MsgType::Push => Msg::Push(members(text, p)?),
        MsgType::Pushed => Msg::Pushed(members(text, p)?),
        MsgType::Ready => Msg::Ready(members(text, p)?),
        MsgType::Done => Msg::Done(members(text, p)?),
        MsgType::Abort => Msg::Abort(members(text, p)?),
        MsgType::Deregister => Msg::Deregister(members(text, p)?),
    })
}

/// The members after `msg_type`'s value (at `p`) to the end of the text,
/// read into a fresh `M`.
fn members<'a, M: Fill<'a>>(text: &'a str, mut p: usize) -> Option<M> {
    let b = text.as_bytes();
    let fields = M::FIELDS;
    let mut msg = M::default();
    // The index in `fields` of the key expected next.
    let mut next = 0;
    loop {
        p = skip_ws_at(b, p);
        match *b.get(p)? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
        p = skip_ws_at(b, p + 1);
        let field = match fields.get(next) {
            Some(f) if at(b, p, f.pat) => {
                p += f.pat.len();
                Some(next)
            }
            _ => {
                let (key, after) = key_at(text, p)?;
                p = after;
                match fields.iter().position(|f| f.name == key) {
                    Some(i) => Some(i),
                    None if key == "msg_type" => return None,
                    None => None,
                }
            }
        };
        p = skip_ws_at(b, p);
        p = match field {
            Some(i) => {
                next = i + 1;
                msg.set(i, text, p)?
            }
            // A key this type does not have: validated, then ignored.
            None => skim(b, p)?.0,
        };
    }
    // Only whitespace may follow.
    (skip_ws_at(b, p + 1) == b.len()).then_some(msg)
}
