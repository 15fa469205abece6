//! Raw, validated JSON values borrowed from a frame, and iteration over the
//! members of a raw object.

use core::fmt;

use super::error::{JsonError, JsonErrorKind};
use super::lex::Lexer;
use super::string::JsonStr;

/// The type of a JSON value (`NaN` and `Infinity` count as numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonType {
    /// `null`
    Null,
    /// `true` or `false`
    Bool,
    /// A number, including Python's `NaN`, `Infinity`, `-Infinity`.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// The name used in error messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool => "boolean",
            Self::Number => "number",
            Self::String => "string",
            Self::Array => "array",
            Self::Object => "object",
        }
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One complete JSON value, validated, as the text it was sent as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RawJson<'a> {
    text: &'a str,
}

impl<'a> RawJson<'a> {
    /// The empty object `{}`.
    pub const EMPTY_OBJECT: RawJson<'static> = RawJson { text: "{}" };
    /// The empty array `[]`.
    pub const EMPTY_ARRAY: RawJson<'static> = RawJson { text: "[]" };

    pub(crate) const fn from_validated(text: &'a str) -> Self {
        Self { text }
    }

    /// Validates `text` as exactly one JSON value (surrounding whitespace
    /// allowed) and returns it with its type.
    pub fn parse(text: &'a str) -> Result<(Self, JsonType), JsonError> {
        let mut lx = Lexer::new(text);
        let v = lx.value()?;
        lx.finish()?;
        Ok(v)
    }

    /// [`parse`](Self::parse) by the precise validator alone, without the
    /// lean first pass: the reference that pass is tested (and fuzzed) against.
    #[doc(hidden)]
    pub fn parse_precise(text: &'a str) -> Result<(Self, JsonType), JsonError> {
        let mut lx = Lexer::new(text);
        lx.skip_ws();
        let v = lx.precise_value()?;
        lx.finish()?;
        Ok(v)
    }

    /// Validates `text` as a JSON object.
    pub fn parse_object(text: &'a str) -> Result<Self, JsonError> {
        match Self::parse(text)? {
            (v, JsonType::Object) => Ok(v),
            _ => Err(JsonError::new(
                JsonErrorKind::UnexpectedByte {
                    found: text.trim_start().bytes().next().unwrap_or(b' '),
                    expected: "'{'",
                },
                text.len() - text.trim_start().len(),
            )),
        }
    }

    /// The text as received.
    pub fn as_str(&self) -> &'a str {
        self.text
    }

    /// True for `{}` or `[]`, whatever whitespace is inside.
    pub fn is_empty_container(&self) -> bool {
        let inner = self.text.get(1..self.text.len().saturating_sub(1));
        matches!(self.text.as_bytes().first(), Some(b'{' | b'['))
            && inner.is_some_and(|i| i.trim_matches([' ', '\t', '\n', '\r']).is_empty())
    }

    /// The members of an object, in the order sent. Empty for non-objects.
    pub fn members(&self) -> ObjectIter<'a> {
        let mut lx = Lexer::new(self.text);
        let mut done = true;
        if lx.peek() == Some(b'{') {
            lx.bump();
            lx.skip_ws();
            done = lx.peek() == Some(b'}');
        }
        ObjectIter {
            lx,
            first: true,
            done,
        }
    }

    /// The value of the first member named `key`, if this is an object.
    ///
    /// Python keeps the *last* of duplicate keys; use [`members`](Self::members)
    /// to see them all.
    pub fn get(&self, key: &str) -> Option<RawJson<'a>> {
        self.members()
            .filter_map(Result::ok)
            .filter(|(k, _)| k.eq_str(key))
            .last()
            .map(|(_, v)| v)
    }
}

impl fmt::Debug for RawJson<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawJson({})", self.text)
    }
}

impl fmt::Display for RawJson<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

/// Iterator over the `(key, value)` members of a raw object.
pub struct ObjectIter<'a> {
    lx: Lexer<'a>,
    first: bool,
    done: bool,
}

impl<'a> Iterator for ObjectIter<'a> {
    type Item = Result<(JsonStr<'a>, RawJson<'a>), JsonError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = (|| {
            if !self.first {
                self.lx.skip_ws();
                match self.lx.peek() {
                    Some(b'}') => return Ok(None),
                    _ => self.lx.expect(b',', "',' or '}'")?,
                }
            }
            self.first = false;
            let key = self.lx.key()?;
            let (value, _) = self.lx.value()?;
            Ok(Some((key, value)))
        })();
        match step {
            Ok(Some(kv)) => Some(Ok(kv)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
