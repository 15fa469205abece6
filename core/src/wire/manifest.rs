//! The manifest: where each tensor of a request lies in its slot.
//!
//! On the wire it is an object mapping a field name to a list of tensor
//! entries `{"offset", "shape", "dtype"[, "list_index"]}` (a single entry
//! object instead of a list is accepted too). Decoded manifests stay raw
//! JSON; [`Manifest::iter`] yields typed entries without allocating.

use core::fmt;

use super::error::{DecodeError, DecodeErrorKind as K};
use super::value::{closes, read_val, resolve_key, separator, At};
use crate::json::number::parse_u64;
use crate::json::{JsonError, JsonErrorKind, JsonStr, Lexer, RawJson};

/// The dimensions of a tensor.
#[derive(Clone, Copy)]
pub enum Shape<'a> {
    /// Dimensions given by the application.
    Dims(&'a [u64]),
    /// A validated JSON array of unsigned integers, as received.
    Raw(RawJson<'a>),
}

impl<'a> Shape<'a> {
    /// The dimensions, outermost first.
    pub fn dims(&self) -> ShapeIter<'a> {
        match *self {
            Shape::Dims(d) => ShapeIter(ShapeInner::Dims(d.iter())),
            Shape::Raw(raw) => ShapeIter(ShapeInner::Raw(Lexer::new(raw.as_str()))),
        }
    }

    /// Number of elements (product of the dimensions), or `None` on overflow.
    pub fn elements(&self) -> Option<u64> {
        self.dims().try_fold(1u64, |acc, d| acc.checked_mul(d))
    }
}

impl PartialEq for Shape<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.dims().eq(other.dims())
    }
}

impl fmt::Debug for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.dims()).finish()
    }
}

/// Iterator over the dimensions of a [`Shape`].
#[derive(Clone)]
pub struct ShapeIter<'a>(ShapeInner<'a>);

#[derive(Clone)]
enum ShapeInner<'a> {
    Dims(core::slice::Iter<'a, u64>),
    Raw(Lexer<'a>),
}

impl Iterator for ShapeIter<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match &mut self.0 {
            ShapeInner::Dims(it) => it.next().copied(),
            ShapeInner::Raw(lx) => {
                lx.skip_ws();
                if matches!(lx.peek(), Some(b'[' | b',')) {
                    lx.bump();
                    lx.skip_ws();
                }
                // The array was validated as unsigned integers when the
                // entry was decoded; anything else ends the iteration.
                lx.number().ok().and_then(|t| parse_u64(t).ok())
            }
        }
    }
}

/// One tensor of a manifest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorEntry<'a> {
    /// The request field the tensor belongs to (e.g. `"latents"`).
    pub field: JsonStr<'a>,
    /// Position in the field's list, for list-valued fields.
    pub list_index: Option<u64>,
    /// Byte offset from the start of the slot (a multiple of 512).
    pub offset: u64,
    /// Dimensions.
    pub shape: Shape<'a>,
    /// Element type name as sglang spells it (`"bfloat16"`, ...).
    pub dtype: JsonStr<'a>,
}

impl<'a> TensorEntry<'a> {
    /// A tensor that is the whole of `field` (not in a list) and starts
    /// its slot: the entry of a one-tensor manifest.
    pub const fn single(field: &'a str, dims: &'a [u64], dtype: &'a str) -> Self {
        TensorEntry {
            field: JsonStr::plain(field),
            list_index: None,
            offset: 0,
            shape: Shape::Dims(dims),
            dtype: JsonStr::plain(dtype),
        }
    }
}

/// A request's manifest: typed entries to encode, or raw JSON as received.
#[derive(Clone, Copy, Debug)]
pub enum Manifest<'a> {
    /// Entries built by the application. Entries of one field are written
    /// as one list, in order of first appearance.
    Entries(&'a [TensorEntry<'a>]),
    /// A validated JSON object, as received.
    Raw(RawJson<'a>),
}

impl Default for Manifest<'_> {
    fn default() -> Self {
        Manifest::Raw(RawJson::EMPTY_OBJECT)
    }
}

eq_by_items!(Manifest<'_>);

impl<'a> Manifest<'a> {
    /// The tensor entries, in wire order, each checked on the way.
    pub fn iter(&self) -> ManifestIter<'a> {
        match *self {
            Manifest::Entries(e) => ManifestIter(ManifestInner::Entries(e.iter())),
            Manifest::Raw(raw) => ManifestIter(ManifestInner::Raw(RawIter {
                lx: Lexer::new(raw.as_str()),
                state: State::Start,
            })),
        }
    }

    /// Checks every entry and returns how many there are.
    pub fn validate(&self) -> Result<usize, DecodeError> {
        self.iter().try_fold(0, |n, e| e.map(|_| n + 1))
    }
}

/// Iterator over the entries of a [`Manifest`].
pub struct ManifestIter<'a>(ManifestInner<'a>);

enum ManifestInner<'a> {
    Entries(core::slice::Iter<'a, TensorEntry<'a>>),
    Raw(RawIter<'a>),
}

impl<'a> Iterator for ManifestIter<'a> {
    type Item = Result<TensorEntry<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            ManifestInner::Entries(it) => it.next().copied().map(Ok),
            ManifestInner::Raw(r) => r.next(),
        }
    }
}

struct RawIter<'a> {
    lx: Lexer<'a>,
    state: State<'a>,
}

#[derive(Clone, Copy)]
enum State<'a> {
    Start,
    /// Between fields of the outer object.
    AfterField,
    /// Inside a field's list of entries.
    InList {
        field: JsonStr<'a>,
        first: bool,
    },
    Done,
}

const ENTRY: &str = "manifest";

fn syntax(e: JsonError) -> DecodeError {
    DecodeError::json(e, Some(ENTRY))
}

/// Something other than a separator where one must be.
fn trailing(lx: &Lexer<'_>) -> DecodeError {
    syntax(lx.err(JsonErrorKind::TrailingBytes))
}

fn wrong(v: At<'_>, expected: &'static str) -> DecodeError {
    DecodeError::new(
        K::WrongType {
            expected,
            found: v.json_type(),
        },
        Some(ENTRY),
        v.at,
    )
}

/// The manifest is walked in place, in one pass: entries, their members and
/// shapes are read straight off the lexer; only members ferry does not know
/// are skipped as whole values.
impl<'a> RawIter<'a> {
    fn next(&mut self) -> Option<Result<TensorEntry<'a>, DecodeError>> {
        let r = self.step();
        if !matches!(r, Some(Ok(_))) {
            self.state = State::Done;
        }
        r
    }

    fn step(&mut self) -> Option<Result<TensorEntry<'a>, DecodeError>> {
        loop {
            match self.state {
                State::Done => return None,
                State::Start | State::AfterField => {
                    let first = matches!(self.state, State::Start);
                    match self.open_field(first) {
                        Ok(Some(next)) => {
                            if let Some(entry) = next {
                                return Some(Ok(entry));
                            }
                        }
                        Ok(None) => return None,
                        Err(e) => return Some(Err(e)),
                    }
                }
                State::InList { field, first } => {
                    let lx = &mut self.lx;
                    lx.skip_ws();
                    match lx.peek() {
                        Some(b']') => {
                            lx.bump();
                            self.state = State::AfterField;
                            continue;
                        }
                        Some(b',') if !first => lx.bump(),
                        _ if first => {}
                        _ => return Some(Err(syntax(lx.err(JsonErrorKind::TrailingBytes)))),
                    }
                    self.state = State::InList {
                        field,
                        first: false,
                    };
                    lx.skip_ws();
                    if lx.peek() != Some(b'{') {
                        return Some(match read_val(lx) {
                            Ok(v) => Err(wrong(v, "tensor entry object")),
                            Err(e) => Err(syntax(e)),
                        });
                    }
                    return Some(parse_entry(lx, field));
                }
            }
        }
    }

    /// Reads the next field name and opens its value. `Ok(None)`: no more
    /// fields; `Ok(Some(Some(e)))`: the field held a single entry `e`;
    /// `Ok(Some(None))`: a list was opened.
    #[allow(clippy::type_complexity)]
    fn open_field(&mut self, first: bool) -> Result<Option<Option<TensorEntry<'a>>>, DecodeError> {
        let lx = &mut self.lx;
        if first {
            lx.expect(b'{', "'{'").map_err(syntax)?;
        }
        lx.skip_ws();
        match lx.peek() {
            Some(b'}') => {
                self.state = State::Done;
                return Ok(None);
            }
            Some(b',') if !first => lx.bump(),
            _ if first => {}
            _ => return Err(syntax(lx.err(JsonErrorKind::TrailingBytes))),
        }
        let field = lx.key().map_err(syntax)?;
        lx.skip_ws();
        match lx.peek() {
            Some(b'[') => {
                lx.bump();
                self.state = State::InList { field, first: true };
                Ok(Some(None))
            }
            Some(b'{') => {
                self.state = State::AfterField;
                parse_entry(lx, field).map(|e| Some(Some(e)))
            }
            _ => match read_val(lx) {
                Ok(v) => Err(wrong(v, "list of tensor entries")),
                Err(e) => Err(syntax(e)),
            },
        }
    }
}

/// Reads one entry object at the cursor (at `{`).
fn parse_entry<'a>(lx: &mut Lexer<'a>, field: JsonStr<'a>) -> Result<TensorEntry<'a>, DecodeError> {
    let mut offset = None;
    let mut shape = None;
    let mut dtype = None;
    let mut list_index = None;
    let start = lx.pos();
    lx.expect(b'{', "'{'").map_err(syntax)?;
    if !closes(lx, b'}') {
        loop {
            let key = lx.key().map_err(syntax)?;
            let name = match key.as_plain() {
                Some(k) => k,
                None => resolve_key(key, &["offset", "shape", "dtype", "list_index"]).unwrap_or(""),
            };
            // A `match` on literals compiles to fixed-length compares.
            match name {
                "offset" => offset = Some(read_val(lx).map_err(syntax)?.u64("manifest.offset")?),
                "shape" => shape = Some(parse_shape(lx)?),
                "dtype" => dtype = Some(read_val(lx).map_err(syntax)?.str("manifest.dtype")?),
                "list_index" => {
                    list_index = read_val(lx)
                        .map_err(syntax)?
                        .opt_u64("manifest.list_index")?
                }
                _ => {
                    lx.value().map_err(syntax)?;
                }
            }
            if !separator(lx, b'}').ok_or_else(|| trailing(lx))? {
                break;
            }
        }
    }
    let missing = |name| DecodeError::new(K::MissingField, Some(name), start);
    Ok(TensorEntry {
        field,
        list_index,
        offset: offset.ok_or(missing("manifest.offset"))?,
        shape: shape.ok_or(missing("manifest.shape"))?,
        dtype: dtype.ok_or(missing("manifest.dtype"))?,
    })
}

/// Reads a shape array at the cursor, checking every dimension is a `u64`.
fn parse_shape<'a>(lx: &mut Lexer<'a>) -> Result<Shape<'a>, DecodeError> {
    lx.skip_ws();
    let start = lx.pos();
    if lx.peek() != Some(b'[') {
        let v = read_val(lx).map_err(syntax)?;
        return Err(DecodeError::new(
            K::WrongType {
                expected: "array",
                found: v.json_type(),
            },
            Some("manifest.shape"),
            v.at,
        ));
    }
    lx.bump();
    if !closes(lx, b']') {
        loop {
            read_val(lx).map_err(syntax)?.u64("manifest.shape")?;
            if !separator(lx, b']').ok_or_else(|| trailing(lx))? {
                break;
            }
        }
    }
    Ok(Shape::Raw(RawJson::from_validated(
        &lx.src()[start..lx.pos()],
    )))
}
