//! Decoding errors that name the field and the reason.

use core::fmt;

use crate::json::{JsonError, JsonErrorKind, JsonType};

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The payload is not valid JSON (or not UTF-8).
    Json(JsonErrorKind),
    /// The payload is valid JSON but not an object.
    NotAnObject(JsonType),
    /// The object has no `msg_type`.
    MissingMsgType,
    /// `msg_type` names no transfer message ferry knows.
    UnknownMsgType,
    /// A field has the wrong JSON type.
    WrongType {
        /// What the field must be.
        expected: &'static str,
        /// What it was.
        found: JsonType,
    },
    /// A negative integer where an address or size is expected.
    NegativeInteger,
    /// An integer above `u64::MAX` where an address or size is expected.
    IntegerTooLarge,
    /// A number with a fraction or exponent where an integer is expected.
    NotAnInteger,
    /// A required member of a nested entry (manifest tensor, slot) is absent.
    MissingField,
}

/// A message that could not be decoded: what was wrong, in which field, where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What was wrong.
    pub kind: DecodeErrorKind,
    /// The field at fault (`"data_size"`, `"manifest.shape"`, ...), if any.
    pub field: Option<&'static str>,
    /// Byte offset of the fault in the text that was being decoded: the
    /// payload for [`decode`](super::decode), the nested value for iterators.
    pub at: usize,
}

impl DecodeError {
    pub(crate) const fn new(kind: DecodeErrorKind, field: Option<&'static str>, at: usize) -> Self {
        Self { kind, field, at }
    }

    pub(crate) fn json(e: JsonError, field: Option<&'static str>) -> Self {
        Self::new(DecodeErrorKind::Json(e.kind), field, e.at)
    }
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Json(k) => write!(f, "invalid JSON: {k}"),
            Self::NotAnObject(t) => write!(f, "message must be a JSON object, got {t}"),
            Self::MissingMsgType => f.write_str("missing msg_type"),
            Self::UnknownMsgType => f.write_str("unknown msg_type"),
            Self::WrongType { expected, found } => write!(f, "expected {expected}, got {found}"),
            Self::NegativeInteger => f.write_str("negative integer, expected unsigned 64-bit"),
            Self::IntegerTooLarge => f.write_str("integer larger than 2^64-1"),
            Self::NotAnInteger => f.write_str("number with fraction or exponent, expected integer"),
            Self::MissingField => f.write_str("required field missing"),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(field) = self.field {
            write!(f, "field `{field}`: ")?;
        }
        write!(f, "{} (at byte {})", self.kind, self.at)
    }
}

impl From<JsonError> for DecodeError {
    fn from(e: JsonError) -> Self {
        Self::json(e, None)
    }
}

impl core::error::Error for DecodeError {}
