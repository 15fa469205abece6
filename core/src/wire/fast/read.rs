//! The fast path's readers: one per field type, each reading the value at
//! a position (no leading whitespace) and answering the value and the
//! position after it, or `None` for anything the general decoder must
//! judge (another type, an escape, a syntax error).

use crate::json::lex::skip_ws_at;
use crate::json::skim::{skim, skim_string};
use crate::json::{JsonStr, JsonType, RawJson};

/// A string without escapes.
#[inline(always)]
pub(super) fn str_at(text: &str, p: usize) -> Option<(JsonStr<'_>, usize)> {
    let b = text.as_bytes();
    if b.get(p) != Some(&b'"') {
        return None;
    }
    let end = skim_string(b, p)?;
    Some((JsonStr::plain(text.get(p + 1..end - 1)?), end))
}

/// A string without escapes, or `null`.
#[inline]
pub(super) fn opt_str_at(text: &str, p: usize) -> Option<(Option<JsonStr<'_>>, usize)> {
    if text.as_bytes().get(p..p + 4) == Some(b"null") {
        return Some((None, p + 4));
    }
    str_at(text, p).map(|(s, end)| (Some(s), end))
}

/// An unsigned integer, parsed as it is scanned. Declines a sign (Python's
/// `-0` is left to the general decoder), a fraction or an exponent, a
/// leading zero before another digit, and anything above `u64::MAX`.
#[inline(always)]
pub(super) fn u64_at(text: &str, p: usize) -> Option<(u64, usize)> {
    let b = text.as_bytes();
    let first = b.get(p)?.wrapping_sub(b'0');
    if first > 9 {
        return None;
    }
    let mut v = u64::from(first);
    let mut q = p + 1;
    if first != 0 {
        // Nineteen digits never overflow; only a twentieth is checked.
        let fast_end = (p + 19).min(b.len());
        while q < fast_end {
            let d = b[q].wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            v = v * 10 + u64::from(d);
            q += 1;
        }
        if let Some(d) = b.get(q).map(|c| c.wrapping_sub(b'0')).filter(|&d| d <= 9) {
            v = v.checked_mul(10)?.checked_add(u64::from(d))?;
            q += 1;
        }
    }
    // What would continue a number here makes it something else.
    if matches!(b.get(q), Some(b'0'..=b'9' | b'.' | b'e' | b'E')) {
        return None;
    }
    Some((v, q))
}

/// `true` or `false`.
#[inline]
pub(super) fn bool_at(text: &str, p: usize) -> Option<(bool, usize)> {
    let b = text.as_bytes();
    if b.get(p..p + 4) == Some(b"true") {
        Some((true, p + 4))
    } else if b.get(p..p + 5) == Some(b"false") {
        Some((false, p + 5))
    } else {
        None
    }
}

/// A whole value of type `want`, validated.
#[inline]
fn container_at(text: &str, p: usize, want: JsonType) -> Option<(RawJson<'_>, usize)> {
    let (end, ty) = skim(text.as_bytes(), p)?;
    (ty == want).then_some(())?;
    Some((RawJson::from_validated(text.get(p..end)?), end))
}

/// An object; `null` reads as `{}`, as in the general decoder.
#[inline]
pub(super) fn obj_at(text: &str, p: usize) -> Option<(RawJson<'_>, usize)> {
    match text.as_bytes().get(p)? {
        b'{' => container_at(text, p, JsonType::Object),
        b'n' if text.as_bytes().get(p..p + 4) == Some(b"null") => {
            Some((RawJson::EMPTY_OBJECT, p + 4))
        }
        _ => None,
    }
}

/// An array.
#[inline]
pub(super) fn arr_at(text: &str, p: usize) -> Option<(RawJson<'_>, usize)> {
    match text.as_bytes().get(p)? {
        b'[' => container_at(text, p, JsonType::Array),
        _ => None,
    }
}

/// `"key"` without escapes, then `:`: the key and the position after the
/// colon.
#[inline]
pub(super) fn key_at(text: &str, p: usize) -> Option<(&str, usize)> {
    let b = text.as_bytes();
    let (key, end) = str_at(text, p)?;
    let colon = skip_ws_at(b, end);
    (b.get(colon) == Some(&b':')).then_some(())?;
    Some((key.as_plain()?, colon + 1))
}
