//! JSON strings borrowed from the frame: unescaped lazily, on request, and
//! written back with CPython's `ensure_ascii` escaping.

use core::fmt;

use super::lex::string_special_mask;
use super::sink::{BufferTooSmall, Sink};

/// A JSON string value, borrowed.
///
/// Either the literal text (built by the application with [`JsonStr::plain`],
/// or decoded from a string that had no backslash), or the raw, validated
/// contents between the quotes of a string that contains escapes. Escapes are
/// decoded only when asked: by [`chars`](Self::chars),
/// [`unescape_into`](Self::unescape_into) or a comparison.
#[derive(Clone, Copy)]
pub struct JsonStr<'a> {
    text: &'a str,
    escaped: bool,
}

impl<'a> JsonStr<'a> {
    /// The empty string.
    pub const EMPTY: JsonStr<'static> = JsonStr {
        text: "",
        escaped: false,
    };

    /// A string whose value is exactly `text`.
    pub const fn plain(text: &'a str) -> Self {
        Self {
            text,
            escaped: false,
        }
    }

    /// `raw` must be the validated contents of a JSON string token.
    pub(crate) const fn from_validated(raw: &'a str, escaped: bool) -> Self {
        Self { text: raw, escaped }
    }

    /// The value without copying, if it contains no escapes.
    pub fn as_plain(&self) -> Option<&'a str> {
        (!self.escaped).then_some(self.text)
    }

    /// True if the value must be unescaped before use.
    pub fn is_escaped(&self) -> bool {
        self.escaped
    }

    /// The text as stored: the value itself, or JSON with escapes if
    /// [`is_escaped`](Self::is_escaped).
    pub fn raw(&self) -> &'a str {
        self.text
    }

    /// The decoded characters of the value.
    pub fn chars(&self) -> Chars<'a> {
        Chars {
            rest: self.text,
            escaped: self.escaped,
        }
    }

    /// True if the value is the empty string.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Length of the decoded value in UTF-8 bytes.
    pub fn decoded_len(&self) -> usize {
        if self.escaped {
            self.chars().map(char::len_utf8).sum()
        } else {
            self.text.len()
        }
    }

    /// Decodes the value into `buf` and returns it, or the size needed.
    pub fn unescape_into<'b>(&self, buf: &'b mut [u8]) -> Result<&'b str, BufferTooSmall> {
        let needed = self.decoded_len();
        let Some(out) = buf.get_mut(..needed) else {
            return Err(BufferTooSmall { needed });
        };
        let mut n = 0;
        for c in self.chars() {
            n += c.encode_utf8(&mut out[n..]).len();
        }
        // Every byte came from `char::encode_utf8`, so this cannot fail; the
        // fallback keeps the function panic-free regardless.
        core::str::from_utf8(&out[..n]).map_err(|_| BufferTooSmall { needed })
    }

    /// True if the decoded value equals `s`.
    pub fn eq_str(&self, s: &str) -> bool {
        if self.escaped {
            self.chars().eq(s.chars())
        } else {
            self.text == s
        }
    }
}

impl PartialEq for JsonStr<'_> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        // The same text (e.g. one `&'static str` field name on every entry
        // of a list) needs no comparison.
        if core::ptr::eq(self.text, other.text) && self.escaped == other.escaped {
            return true;
        }
        if !self.escaped && !other.escaped {
            self.text == other.text
        } else {
            self.chars().eq(other.chars())
        }
    }
}

impl Eq for JsonStr<'_> {}

impl PartialEq<str> for JsonStr<'_> {
    fn eq(&self, other: &str) -> bool {
        self.eq_str(other)
    }
}

impl PartialEq<&str> for JsonStr<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.eq_str(other)
    }
}

impl Default for JsonStr<'_> {
    fn default() -> Self {
        JsonStr::EMPTY
    }
}

impl<'a> From<&'a str> for JsonStr<'a> {
    fn from(s: &'a str) -> Self {
        JsonStr::plain(s)
    }
}

impl fmt::Display for JsonStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.escaped {
            return f.write_str(self.text);
        }
        for c in self.chars() {
            fmt::Write::write_char(f, c)?;
        }
        Ok(())
    }
}

impl fmt::Debug for JsonStr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        for c in self.chars() {
            for e in c.escape_debug() {
                fmt::Write::write_char(f, e)?;
            }
        }
        f.write_str("\"")
    }
}

/// Iterator over the decoded characters of a [`JsonStr`].
#[derive(Clone)]
pub struct Chars<'a> {
    rest: &'a str,
    escaped: bool,
}

impl Chars<'_> {
    fn hex4(&mut self) -> Option<u32> {
        let digits = self.rest.get(..4)?;
        let v = u32::from_str_radix(digits, 16).ok()?;
        self.rest = &self.rest[4..];
        Some(v)
    }

    /// Decodes one escape; `rest` starts after the backslash. Input was
    /// validated when the string was lexed, so the `None` arms (mapped to
    /// U+FFFD) are unreachable for strings this crate produced.
    fn unescape(&mut self) -> Option<char> {
        let kind = *self.rest.as_bytes().first()?;
        self.rest = &self.rest[1..];
        Some(match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                if (0xD800..0xDC00).contains(&hi) {
                    self.rest = self.rest.strip_prefix("\\u")?;
                    let lo = self.hex4()?;
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo.checked_sub(0xDC00)?))?
                } else {
                    char::from_u32(hi)?
                }
            }
            _ => return None,
        })
    }
}

impl Iterator for Chars<'_> {
    type Item = char;

    #[inline]
    fn next(&mut self) -> Option<char> {
        let mut it = self.rest.chars();
        let c = it.next()?;
        self.rest = it.as_str();
        if c == '\\' && self.escaped {
            Some(self.unescape().unwrap_or(char::REPLACEMENT_CHARACTER))
        } else {
            Some(c)
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_u_escape(out: &mut Sink<'_>, unit: u32) {
    out.put(&[
        b'\\',
        b'u',
        HEX[(unit >> 12 & 0xf) as usize],
        HEX[(unit >> 8 & 0xf) as usize],
        HEX[(unit >> 4 & 0xf) as usize],
        HEX[(unit & 0xf) as usize],
    ]);
}

/// Writes one character the way CPython's `ensure_ascii` encoder does.
#[inline]
fn write_escaped_char(out: &mut Sink<'_>, c: char) {
    match c {
        '"' => out.put(b"\\\""),
        '\\' => out.put(b"\\\\"),
        '\n' => out.put(b"\\n"),
        '\r' => out.put(b"\\r"),
        '\t' => out.put(b"\\t"),
        '\u{8}' => out.put(b"\\b"),
        '\u{c}' => out.put(b"\\f"),
        ' '..='~' => out.byte(c as u8),
        _ => {
            let v = u32::from(c);
            if v >= 0x10000 {
                let v = v - 0x10000;
                write_u_escape(out, 0xD800 | (v >> 10));
                write_u_escape(out, 0xDC00 | (v & 0x3ff));
            } else {
                write_u_escape(out, v);
            }
        }
    }
}

#[inline]
fn is_verbatim(b: u8) -> bool {
    (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'
}

/// True if any byte of `w` needs escaping: below 0x20, above 0x7e, `"` or
/// `\\` (SWAR, eight bytes at a time).
#[inline]
fn has_non_verbatim(w: u64) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    // A byte of 0x7f or more has its high bit set in `w` or in `w + 1`; a
    // carry out of a byte happens only from 0xff, which is caught itself.
    let high = (w | w.wrapping_add(LO)) & HI;
    (string_special_mask(w) | high) != 0
}

/// True if no byte of `bytes` needs escaping: whole words, the last one
/// overlapping the one before it, so a short string is one or two tests.
#[inline]
fn all_verbatim(bytes: &[u8]) -> bool {
    let word = |chunk: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        u64::from_le_bytes(w)
    };
    if bytes.len() < 8 {
        // Padded with a byte that needs no escape.
        let mut w = [b'a'; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        return !has_non_verbatim(u64::from_le_bytes(w));
    }
    let last = bytes.len() - 8;
    let mut i = 0;
    while i < last {
        if has_non_verbatim(word(&bytes[i..i + 8])) {
            return false;
        }
        i += 8;
    }
    !has_non_verbatim(word(&bytes[last..]))
}

/// Writes `s` as a quoted JSON string with CPython's escaping
/// (`json.dumps(s)`, `ensure_ascii=True`).
#[inline]
pub fn write_escaped_str(out: &mut Sink<'_>, s: &str) {
    // The common case, printable ASCII: one copy between the quotes.
    if all_verbatim(s.as_bytes()) {
        return out.put_quoted(s.as_bytes());
    }
    write_escaping(out, s);
}

/// [`write_escaped_str`] for a string with something to escape.
#[cold]
#[inline(never)]
fn write_escaping(out: &mut Sink<'_>, s: &str) {
    out.byte(b'"');
    let bytes = s.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        while let Some(chunk) = bytes.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            if has_non_verbatim(u64::from_le_bytes(w)) {
                break;
            }
            i += 8;
        }
        while bytes.get(i).is_some_and(|&b| is_verbatim(b)) {
            i += 1;
        }
        out.put(&bytes[start..i]);
        match s.get(i..).and_then(|r| r.chars().next()) {
            Some(c) => {
                write_escaped_char(out, c);
                i += c.len_utf8();
            }
            None => break,
        }
    }
    out.byte(b'"');
}

/// Writes decoded characters as a quoted JSON string with CPython's escaping.
pub fn write_escaped_chars(out: &mut Sink<'_>, chars: impl Iterator<Item = char>) {
    out.byte(b'"');
    for c in chars {
        write_escaped_char(out, c);
    }
    out.byte(b'"');
}

impl JsonStr<'_> {
    /// Writes the value as a quoted JSON string exactly as CPython would.
    #[inline]
    pub fn write_json(&self, out: &mut Sink<'_>) {
        if self.escaped {
            self.write_unescaped(out);
        } else {
            write_escaped_str(out, self.text);
        }
    }

    /// [`write_json`](Self::write_json) for a string received with
    /// escapes: decoded, then escaped CPython's way. Out of line, so the
    /// plain case stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn write_unescaped(&self, out: &mut Sink<'_>) {
        write_escaped_chars(out, self.chars());
    }
}
