//! One member value read off the lexer, and its conversion to the field
//! types of the protocol with errors that name the field.

use super::error::{DecodeError, DecodeErrorKind as K};
use crate::json::number::{parse_u64, U64Error};
use crate::json::{JsonError, JsonStr, JsonType, Lexer, NumberToken, RawJson};

/// A value as the decoder first sees it, before its field's type is known.
#[derive(Clone, Copy)]
pub(crate) enum Val<'a> {
    Str(JsonStr<'a>),
    Num(NumberToken<'a>),
    Bool(bool),
    Null,
    /// Arrays, objects, and Python's non-finite number literals.
    Raw(RawJson<'a>, JsonType),
}

/// A value and the byte offset where it starts.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub val: Val<'a>,
    pub at: usize,
}

/// Reads the next value (after optional whitespace).
#[inline]
pub(crate) fn read_val<'a>(lx: &mut Lexer<'a>) -> Result<At<'a>, JsonError> {
    lx.skip_ws();
    let at = lx.pos();
    let val = match lx.peek() {
        Some(b'"') => Val::Str(lx.string()?),
        Some(b'0'..=b'9') => Val::Num(lx.number()?),
        Some(b'-') if lx.src().as_bytes().get(at + 1) != Some(&b'I') => Val::Num(lx.number()?),
        _ => {
            let (raw, ty) = lx.value()?;
            match raw.as_str() {
                "true" => Val::Bool(true),
                "false" => Val::Bool(false),
                "null" => Val::Null,
                _ => Val::Raw(raw, ty),
            }
        }
    };
    Ok(At { val, at })
}

impl<'a> At<'a> {
    pub fn json_type(&self) -> JsonType {
        match self.val {
            Val::Str(_) => JsonType::String,
            Val::Num(_) => JsonType::Number,
            Val::Bool(_) => JsonType::Bool,
            Val::Null => JsonType::Null,
            Val::Raw(_, t) => t,
        }
    }

    fn wrong(&self, field: &'static str, expected: &'static str) -> DecodeError {
        DecodeError::new(
            K::WrongType {
                expected,
                found: self.json_type(),
            },
            Some(field),
            self.at,
        )
    }

    #[inline]
    pub fn u64(&self, field: &'static str) -> Result<u64, DecodeError> {
        match self.val {
            Val::Num(tok) => parse_u64(tok).map_err(|e| {
                let kind = match e {
                    U64Error::Negative => K::NegativeInteger,
                    U64Error::TooLarge => K::IntegerTooLarge,
                    U64Error::NotAnInteger => K::NotAnInteger,
                };
                DecodeError::new(kind, Some(field), self.at)
            }),
            Val::Raw(_, JsonType::Number) => {
                Err(DecodeError::new(K::NotAnInteger, Some(field), self.at))
            }
            _ => Err(self.wrong(field, "unsigned integer")),
        }
    }

    pub fn opt_u64(&self, field: &'static str) -> Result<Option<u64>, DecodeError> {
        match self.val {
            Val::Null => Ok(None),
            _ => self.u64(field).map(Some),
        }
    }

    #[inline]
    pub fn str(&self, field: &'static str) -> Result<JsonStr<'a>, DecodeError> {
        match self.val {
            Val::Str(s) => Ok(s),
            _ => Err(self.wrong(field, "string")),
        }
    }

    #[inline]
    pub fn opt_str(&self, field: &'static str) -> Result<Option<JsonStr<'a>>, DecodeError> {
        match self.val {
            Val::Null => Ok(None),
            Val::Str(s) => Ok(Some(s)),
            _ => Err(self.wrong(field, "string or null")),
        }
    }

    pub fn bool(&self, field: &'static str) -> Result<bool, DecodeError> {
        match self.val {
            Val::Bool(b) => Ok(b),
            _ => Err(self.wrong(field, "boolean")),
        }
    }

    /// An object; `null` reads as `{}`, as the seed's `__post_init__` does.
    pub fn object(&self, field: &'static str) -> Result<RawJson<'a>, DecodeError> {
        match self.val {
            Val::Null => Ok(RawJson::EMPTY_OBJECT),
            Val::Raw(raw, JsonType::Object) => Ok(raw),
            _ => Err(self.wrong(field, "object")),
        }
    }

    pub fn array(&self, field: &'static str) -> Result<RawJson<'a>, DecodeError> {
        match self.val {
            Val::Raw(raw, JsonType::Array) => Ok(raw),
            _ => Err(self.wrong(field, "array")),
        }
    }
}

/// Walks the members of a raw object, calling `f(key, value)` for each.
pub(crate) fn for_each_member<'a>(
    raw: RawJson<'a>,
    field: &'static str,
    mut f: impl FnMut(JsonStr<'a>, At<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let mut lx = Lexer::new(raw.as_str());
    let j = |e| DecodeError::json(e, Some(field));
    lx.expect(b'{', "'{'").map_err(j)?;
    if closes(&mut lx, b'}') {
        return Ok(());
    }
    loop {
        let key = lx.key().map_err(j)?;
        let v = read_val(&mut lx).map_err(j)?;
        f(key, v)?;
        match separator(&mut lx, b'}') {
            Some(true) => {}
            Some(false) => return Ok(()),
            None => return Err(j(lx.err(crate::json::JsonErrorKind::TrailingBytes))),
        }
    }
}

/// Whether the container just opened is empty: past whitespace, its
/// `close` (then consumed).
#[inline]
pub(crate) fn closes(lx: &mut Lexer<'_>, close: u8) -> bool {
    lx.skip_ws();
    let empty = lx.peek() == Some(close);
    if empty {
        lx.bump();
    }
    empty
}

/// Reads what follows a member or an element (whitespace first): `Some(true)`
/// for a `,` (another one follows), `Some(false)` for the container's
/// `close`; both are consumed. `None` for anything else, left unread for
/// the caller's error.
#[inline]
pub(crate) fn separator(lx: &mut Lexer<'_>, close: u8) -> Option<bool> {
    lx.skip_ws();
    match lx.peek()? {
        b',' => {
            lx.bump();
            Some(true)
        }
        b if b == close => {
            lx.bump();
            Some(false)
        }
        _ => None,
    }
}

/// Shifts the offset of an error found inside a nested value by `base`.
pub(crate) fn shift(mut e: DecodeError, base: usize) -> DecodeError {
    e.at += base;
    e
}

/// The name among `known` that `key` spells (escapes decoded), if any.
pub(crate) fn resolve_key(key: JsonStr<'_>, known: &[&'static str]) -> Option<&'static str> {
    match key.as_plain() {
        Some(k) => known.iter().copied().find(|&n| n == k),
        None => known.iter().copied().find(|&n| key.eq_str(n)),
    }
}
