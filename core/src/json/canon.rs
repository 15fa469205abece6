//! Re-emits a validated JSON value the way CPython's
//! `json.dumps(json.loads(text), separators=(",", ":"))` would.

use super::error::JsonError;
use super::lex::Lexer;
use super::number::write_canonical_number;
use super::sink::Sink;
use super::value::RawJson;

/// Writes `value` in CPython's compact canonical form: no whitespace,
/// strings re-escaped with `ensure_ascii`, integers as their digits, other
/// numbers through `float` and `repr`. Object member order is kept.
///
/// One difference remains: CPython collapses duplicate keys of a nested
/// object into one (last value, first position); they are kept here, as
/// collapsing them would need storage proportional to the object.
pub fn write_canonical(out: &mut Sink<'_>, value: RawJson<'_>) -> Result<(), JsonError> {
    let mut lx = Lexer::new(value.as_str());
    loop {
        lx.skip_ws();
        let Some(b) = lx.peek() else {
            return Ok(());
        };
        match b {
            b'{' | b'}' | b'[' | b']' | b',' | b':' => {
                out.byte(b);
                lx.bump();
            }
            b'"' => lx.string()?.write_json(out),
            b'-' if lx.src().as_bytes()[lx.pos()..].starts_with(b"-Infinity") => {
                out.put(b"-Infinity");
                for _ in 0.."-Infinity".len() {
                    lx.bump();
                }
            }
            b'-' | b'0'..=b'9' => write_canonical_number(out, lx.number()?),
            _ => {
                // A literal: true, false, null, NaN, Infinity.
                let start = lx.pos();
                while lx.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
                    lx.bump();
                }
                if start == lx.pos() {
                    return Err(lx.err(super::JsonErrorKind::UnexpectedByte {
                        found: b,
                        expected: "a JSON value",
                    }));
                }
                out.put(&lx.src().as_bytes()[start..lx.pos()]);
            }
        }
    }
}
