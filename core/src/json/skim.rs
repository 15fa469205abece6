//! The lean validator: whole values checked in one pass with the cursor
//! in a register, for the values that need no more than a yes or no (the
//! nested `manifest`, `scalar_fields`, unknown members). Anything it does
//! not handle (a backslash escape, any error) it declines, and the
//! precise validator in `lex.rs` decides, so every error has exactly one
//! implementation.

use super::lex::{scan_number, skip_ws_at, string_special_mask, MAX_DEPTH};
use super::value::JsonType;

/// Validates the value starting at `b[p]` (no leading whitespace) and returns
/// where it ends and its type, or `None` if it is invalid *or* contains
/// anything this fast path leaves to the precise validator: a backslash
/// escape in a string. Same grammar, same depth limit, same bit stack as
/// [`Lexer::precise_value`](super::Lexer::precise_value).
pub(crate) fn skim(b: &[u8], mut p: usize) -> Option<(usize, JsonType)> {
    let top = match b.get(p)? {
        b'{' => JsonType::Object,
        b'[' => JsonType::Array,
        _ => return skim_scalar(b, p),
    };
    // Nesting: one bit per open container, 1 for an object.
    let mut stack: u128 = 0;
    let mut depth = 0usize;
    // `p` is at a value, whitespace skipped.
    'value: loop {
        match *b.get(p)? {
            b'"' => p = skim_string(b, p)?,
            c @ b'1'..=b'9' => p = skim_integer(b, p, c)?,
            c @ (b'{' | b'[') => {
                if depth == MAX_DEPTH {
                    return None;
                }
                let is_obj = c == b'{';
                stack = (stack << 1) | u128::from(is_obj);
                depth += 1;
                p = skip_ws_at(b, p + 1);
                let close = if is_obj { b'}' } else { b']' };
                if b.get(p) != Some(&close) {
                    if is_obj {
                        p = skim_key(b, p)?;
                    }
                    continue 'value;
                }
                p += 1;
                stack >>= 1;
                depth -= 1;
            }
            _ => p = skim_scalar(b, p)?.0,
        }
        // After a value: close containers or move to the next element.
        loop {
            if depth == 0 {
                return Some((p, top));
            }
            let in_obj = stack & 1 == 1;
            p = skip_ws_at(b, p);
            match *b.get(p)? {
                b',' => {
                    p = skip_ws_at(b, p + 1);
                    if in_obj {
                        p = skim_key(b, p)?;
                    }
                    continue 'value;
                }
                b'}' if in_obj => {}
                b']' if !in_obj => {}
                _ => return None,
            }
            p += 1;
            stack >>= 1;
            depth -= 1;
        }
    }
}

/// `"key"` and `:` at `p`; the position of the value after them
/// (whitespace skipped).
#[inline(always)]
fn skim_key(b: &[u8], p: usize) -> Option<usize> {
    if b.get(p) != Some(&b'"') {
        return None;
    }
    let mut p = skim_string(b, p)?;
    // Compact JSON: the colon right after the key, the value right after it.
    if b.get(p) != Some(&b':') {
        p = skip_ws_at(b, p);
        if b.get(p) != Some(&b':') {
            return None;
        }
    }
    Some(skip_ws_at(b, p + 1))
}

/// A string without escapes at `b[p] == '"'`; the position after it.
#[inline(always)]
pub(crate) fn skim_string(b: &[u8], mut p: usize) -> Option<usize> {
    p += 1;
    while let Some(chunk) = b.get(p..p + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let mask = string_special_mask(u64::from_le_bytes(w));
        if mask != 0 {
            p += (mask.trailing_zeros() / 8) as usize;
            return (b[p] == b'"').then_some(p + 1);
        }
        p += 8;
    }
    loop {
        match *b.get(p)? {
            b'"' => return Some(p + 1),
            b'\\' => return None,
            c if c < 0x20 => return None,
            _ => p += 1,
        }
    }
}

/// A number at `b[p]`, whose first byte `first` is a digit from 1 to 9:
/// the common unsigned integer read in a tight loop, a fraction or an
/// exponent left to the full grammar.
#[inline(always)]
fn skim_integer(b: &[u8], p: usize, first: u8) -> Option<usize> {
    debug_assert!(first.is_ascii_digit() && first != b'0');
    let mut q = p + 1;
    while b.get(q).is_some_and(u8::is_ascii_digit) {
        q += 1;
    }
    match b.get(q) {
        Some(b'.' | b'e' | b'E') => scan_number(b, p).ok().map(|(end, _)| end),
        _ => Some(q),
    }
}

/// A scalar at `b[p]`: its end and type.
#[inline]
fn skim_scalar(b: &[u8], p: usize) -> Option<(usize, JsonType)> {
    let lit = |word: &[u8], ty| b[p..].starts_with(word).then_some((p + word.len(), ty));
    match *b.get(p)? {
        b'"' => Some((skim_string(b, p)?, JsonType::String)),
        b'0'..=b'9' => Some((scan_number(b, p).ok()?.0, JsonType::Number)),
        b'-' => {
            if b[p..].starts_with(b"-Infinity") {
                return Some((p + 9, JsonType::Number));
            }
            Some((scan_number(b, p).ok()?.0, JsonType::Number))
        }
        b't' => lit(b"true", JsonType::Bool),
        b'f' => lit(b"false", JsonType::Bool),
        b'n' => lit(b"null", JsonType::Null),
        b'N' => lit(b"NaN", JsonType::Number),
        b'I' => lit(b"Infinity", JsonType::Number),
        _ => None,
    }
}
