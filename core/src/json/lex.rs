//! The byte-level lexer: whitespace, strings, numbers, literals, and an
//! iterative validator for whole values whose depth is bounded by a bit
//! stack instead of the call stack, so no input can overflow it.

use super::error::{JsonError, JsonErrorKind as K};
use super::skim::skim;
use super::string::JsonStr;
use super::value::{JsonType, RawJson};

/// Deepest nesting of arrays and objects accepted anywhere in a message.
///
/// CPython stops near its recursion limit (about 1000); no transfer message
/// needs more than a handful of levels, and 128 keeps the depth stack in one
/// `u128`.
pub const MAX_DEPTH: usize = 128;

/// A cursor over a UTF-8 JSON text.
#[derive(Clone)]
pub(crate) struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

/// A mask with the high bit set in the first byte of `w` (in memory order)
/// that is `"`, `\\` or below 0x20, or zero if there is none. Bits above the
/// first match may be spurious (borrows), the lowest one never is.
#[inline]
pub(crate) fn string_special_mask(w: u64) -> u64 {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(LO) & !x & HI;
    let below_space = w.wrapping_sub(LO * 0x20) & !w & HI;
    below_space | zero(w ^ (LO * u64::from(b'"'))) | zero(w ^ (LO * u64::from(b'\\')))
}

/// A number token: its text and whether it has a fraction or exponent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NumberToken<'a> {
    pub text: &'a str,
    pub is_integer: bool,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Self { src, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn src(&self) -> &'a str {
        self.src
    }

    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    #[inline]
    pub fn bump(&mut self) {
        self.pos += 1;
    }

    #[inline]
    pub fn skip_ws(&mut self) {
        self.pos = skip_ws_at(self.src.as_bytes(), self.pos);
    }

    pub fn err(&self, kind: K) -> JsonError {
        JsonError::new(kind, self.pos)
    }

    fn unexpected(&self, expected: &'static str) -> JsonError {
        match self.peek() {
            Some(found) => self.err(K::UnexpectedByte { found, expected }),
            None => self.err(K::UnexpectedEnd),
        }
    }

    /// Skips whitespace, then consumes `want` or fails naming `expected`.
    #[inline]
    pub fn expect(&mut self, want: u8, expected: &'static str) -> Result<(), JsonError> {
        self.skip_ws();
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    /// Fails unless only whitespace remains.
    pub fn finish(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.pos == self.src.len() {
            Ok(())
        } else {
            Err(self.err(K::TrailingBytes))
        }
    }

    /// Reads a string token at the cursor (which must be at `"`).
    #[inline]
    pub fn string(&mut self) -> Result<JsonStr<'a>, JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("'\"'"));
        }
        let start = self.pos + 1;
        let b = self.src.as_bytes();
        let mut p = start;
        let mut escaped = false;
        loop {
            // The common case: a run of ordinary bytes, eight at a time.
            loop {
                if let Some(chunk) = b.get(p..p + 8) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(chunk);
                    let mask = string_special_mask(u64::from_le_bytes(w));
                    if mask == 0 {
                        p += 8;
                        continue;
                    }
                    p += (mask.trailing_zeros() / 8) as usize;
                    break;
                }
                while let Some(&c) = b.get(p) {
                    if c == b'"' || c == b'\\' || c < 0x20 {
                        break;
                    }
                    p += 1;
                }
                break;
            }
            self.pos = p;
            match b.get(p) {
                None => return Err(self.err(K::UnexpectedEnd)),
                Some(b'"') => {
                    self.pos = p + 1;
                    return Ok(JsonStr::from_validated(&self.src[start..p], escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                    p = self.pos;
                }
                Some(_) => return Err(self.err(K::ControlCharInString)),
            }
        }
    }

    /// Validates one escape sequence at the cursor (at the backslash).
    fn escape(&mut self) -> Result<(), JsonError> {
        let at = self.pos;
        self.pos += 1;
        match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.pos += 1;
                Ok(())
            }
            Some(b'u') => {
                self.pos += 1;
                let unit = self.hex4(at)?;
                match unit {
                    0xD800..=0xDBFF => {
                        let b = self.src.as_bytes();
                        if b.get(self.pos) == Some(&b'\\') && b.get(self.pos + 1) == Some(&b'u') {
                            self.pos += 2;
                            let low = self.hex4(at)?;
                            if (0xDC00..=0xDFFF).contains(&low) {
                                return Ok(());
                            }
                        }
                        Err(JsonError::new(K::LoneSurrogate, at))
                    }
                    0xDC00..=0xDFFF => Err(JsonError::new(K::LoneSurrogate, at)),
                    _ => Ok(()),
                }
            }
            None => Err(self.err(K::UnexpectedEnd)),
            Some(_) => Err(JsonError::new(K::InvalidEscape, at)),
        }
    }

    fn hex4(&mut self, escape_at: usize) -> Result<u16, JsonError> {
        let b = self.src.as_bytes();
        let Some(digits) = b.get(self.pos..self.pos + 4) else {
            return Err(JsonError::new(K::InvalidEscape, escape_at));
        };
        let mut v: u16 = 0;
        for &d in digits {
            let n = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(JsonError::new(K::InvalidEscape, escape_at)),
            };
            v = (v << 4) | u16::from(n);
        }
        self.pos += 4;
        Ok(v)
    }

    /// Reads a number token (strict JSON grammar) at the cursor.
    #[inline]
    pub fn number(&mut self) -> Result<NumberToken<'a>, JsonError> {
        let start = self.pos;
        match scan_number(self.src.as_bytes(), start) {
            Ok((end, is_integer)) => {
                self.pos = end;
                Ok(NumberToken {
                    text: &self.src[start..end],
                    is_integer,
                })
            }
            Err(at) => {
                self.pos = at;
                Err(self.err(K::InvalidNumber))
            }
        }
    }

    /// Consumes `word` if the input continues with it.
    fn literal(&mut self, word: &str) -> bool {
        if self.src.as_bytes()[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            true
        } else {
            false
        }
    }

    /// Reads one scalar token (not `{` or `[`) and tells its type.
    fn scalar(&mut self) -> Result<JsonType, JsonError> {
        match self.peek() {
            Some(b'"') => self.string().map(|_| JsonType::String),
            Some(b'-') => {
                if self.literal("-Infinity") {
                    Ok(JsonType::Number)
                } else {
                    self.number().map(|_| JsonType::Number)
                }
            }
            Some(b'0'..=b'9') => self.number().map(|_| JsonType::Number),
            Some(b't') if self.literal("true") => Ok(JsonType::Bool),
            Some(b'f') if self.literal("false") => Ok(JsonType::Bool),
            Some(b'n') if self.literal("null") => Ok(JsonType::Null),
            Some(b'N') if self.literal("NaN") => Ok(JsonType::Number),
            Some(b'I') if self.literal("Infinity") => Ok(JsonType::Number),
            _ => Err(self.unexpected("a JSON value")),
        }
    }

    /// Reads `"key"` and the `:` after it.
    #[inline]
    pub fn key(&mut self) -> Result<JsonStr<'a>, JsonError> {
        self.skip_ws();
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("an object key string"));
        }
        let key = self.string()?;
        self.expect(b':', "':' after an object key")?;
        Ok(key)
    }

    /// Validates one complete value (skipping leading whitespace) and returns
    /// it as raw text with its type.
    ///
    /// A lean validator ([`skim`]) runs first; whenever it meets anything it
    /// does not handle (an escape, an error) the precise one below decides,
    /// so that every error has exactly one implementation.
    pub fn value(&mut self) -> Result<(RawJson<'a>, JsonType), JsonError> {
        self.skip_ws();
        if let Some((end, ty)) = skim(self.src.as_bytes(), self.pos) {
            let raw = RawJson::from_validated(&self.src[self.pos..end]);
            self.pos = end;
            return Ok((raw, ty));
        }
        self.precise_value()
    }

    /// The validator of record: nesting is tracked in a `u128` bit stack
    /// (1 = object, 0 = array), never by recursion.
    pub(crate) fn precise_value(&mut self) -> Result<(RawJson<'a>, JsonType), JsonError> {
        let start = self.pos;
        let top_type = match self.peek() {
            Some(b'{') => JsonType::Object,
            Some(b'[') => JsonType::Array,
            _ => {
                let t = self.scalar()?;
                return Ok((RawJson::from_validated(&self.src[start..self.pos]), t));
            }
        };
        let mut stack: u128 = 0;
        let mut depth: usize = 0;
        'value: loop {
            // Expecting a value.
            self.skip_ws();
            match self.peek() {
                Some(c @ (b'{' | b'[')) => {
                    if depth == MAX_DEPTH {
                        return Err(self.err(K::TooDeep));
                    }
                    let is_obj = c == b'{';
                    stack = (stack << 1) | u128::from(is_obj);
                    depth += 1;
                    self.pos += 1;
                    self.skip_ws();
                    let close = if is_obj { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.pos += 1;
                        // Fall through to "after a value" below.
                        stack >>= 1;
                        depth -= 1;
                    } else {
                        if is_obj {
                            self.key()?;
                        }
                        continue 'value;
                    }
                }
                _ => {
                    self.scalar()?;
                }
            }
            // After a value: close containers or move to the next element.
            loop {
                if depth == 0 {
                    return Ok((
                        RawJson::from_validated(&self.src[start..self.pos]),
                        top_type,
                    ));
                }
                let in_obj = stack & 1 == 1;
                self.skip_ws();
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if in_obj {
                            self.key()?;
                        }
                        continue 'value;
                    }
                    Some(b'}') if in_obj => {}
                    Some(b']') if !in_obj => {}
                    _ => {
                        return Err(self.unexpected(if in_obj {
                            "',' or '}'"
                        } else {
                            "',' or ']'"
                        }))
                    }
                }
                self.pos += 1;
                stack >>= 1;
                depth -= 1;
            }
        }
    }
}

/// A strict JSON number at `b[p]`: the position after it, and whether it
/// is an integer (no fraction, no exponent); on failure, the position of
/// the byte that broke the grammar.
#[inline]
pub(crate) fn scan_number(b: &[u8], mut p: usize) -> Result<(usize, bool), usize> {
    let digits = |mut p: usize| {
        let s = p;
        while b.get(p).is_some_and(u8::is_ascii_digit) {
            p += 1;
        }
        (p, p - s)
    };
    if b.get(p) == Some(&b'-') {
        p += 1;
    }
    match b.get(p) {
        Some(b'0') => p += 1,
        Some(b'1'..=b'9') => p = digits(p).0,
        _ => return Err(p),
    }
    let mut is_integer = true;
    if b.get(p) == Some(&b'.') {
        let (q, n) = digits(p + 1);
        if n == 0 {
            return Err(q);
        }
        p = q;
        is_integer = false;
    }
    if matches!(b.get(p), Some(b'e' | b'E')) {
        is_integer = false;
        p += 1;
        if matches!(b.get(p), Some(b'+' | b'-')) {
            p += 1;
        }
        let (q, n) = digits(p);
        if n == 0 {
            return Err(q);
        }
        p = q;
    }
    Ok((p, is_integer))
}

/// The first position at or after `p` that is not JSON whitespace.
#[inline]
pub(crate) fn skip_ws_at(b: &[u8], mut p: usize) -> usize {
    // Compact JSON has no whitespace: one test in the common case.
    if b.get(p).is_some_and(|&c| c > b' ') {
        return p;
    }
    while matches!(b.get(p), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        p += 1;
    }
    p
}
