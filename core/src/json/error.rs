//! Errors of the JSON layer: what was wrong and at which byte.

use core::fmt;

/// What made a JSON text invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JsonErrorKind {
    /// The input ended inside a value.
    UnexpectedEnd,
    /// A byte that cannot appear here; `expected` says what could.
    UnexpectedByte {
        /// The offending byte.
        found: u8,
        /// What the grammar allowed at this point.
        expected: &'static str,
    },
    /// A number that does not follow the JSON grammar (`01`, `1.`, `-`, `1e`).
    InvalidNumber,
    /// A backslash escape that JSON does not define, or bad `\u` hex digits.
    InvalidEscape,
    /// A `\uD800`–`\uDFFF` escape that is not half of a valid surrogate pair.
    LoneSurrogate,
    /// A raw control character (below U+0020) inside a string.
    ControlCharInString,
    /// Objects and arrays nested deeper than [`MAX_DEPTH`](super::MAX_DEPTH).
    TooDeep,
    /// Bytes after the end of the top-level value.
    TrailingBytes,
    /// The input is not UTF-8.
    NotUtf8,
}

/// A JSON syntax error and the byte offset where it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// What was wrong.
    pub kind: JsonErrorKind,
    /// Byte offset into the text that was being read.
    pub at: usize,
}

impl JsonError {
    pub(crate) const fn new(kind: JsonErrorKind, at: usize) -> Self {
        Self { kind, at }
    }
}

impl fmt::Display for JsonErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnexpectedEnd => f.write_str("unexpected end of input"),
            Self::UnexpectedByte { found, expected } => {
                if found.is_ascii_graphic() {
                    write!(f, "unexpected '{}', expected {expected}", found as char)
                } else {
                    write!(f, "unexpected byte 0x{found:02x}, expected {expected}")
                }
            }
            Self::InvalidNumber => f.write_str("invalid number"),
            Self::InvalidEscape => f.write_str("invalid escape sequence"),
            Self::LoneSurrogate => f.write_str("lone UTF-16 surrogate in \\u escape"),
            Self::ControlCharInString => f.write_str("raw control character in string"),
            Self::TooDeep => write!(f, "nesting deeper than {} levels", super::MAX_DEPTH),
            Self::TrailingBytes => f.write_str("trailing bytes after the JSON value"),
            Self::NotUtf8 => f.write_str("not valid UTF-8"),
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.kind, self.at)
    }
}

impl core::error::Error for JsonError {}
