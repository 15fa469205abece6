//! JSON as the transfer protocol needs it: validated without recursion,
//! borrowed from the frame, and written back the way CPython's
//! `json.dumps(..., separators=(",", ":"))` writes it.
//!
//! Python's `json` module is the reference for every choice here: it accepts
//! `NaN`, `Infinity` and `-Infinity`, escapes everything outside printable
//! ASCII as lowercase `\uXXXX` (surrogate pairs above U+FFFF) and prints
//! floats with `repr`.

mod canon;
mod error;
pub(crate) mod lex;
pub(crate) mod number;
mod sink;
pub(crate) mod skim;
mod string;
mod value;

pub use canon::write_canonical;
pub use error::{JsonError, JsonErrorKind};
pub use lex::MAX_DEPTH;
pub use number::{write_f64, write_u64};
pub use sink::{BufferTooSmall, Sink};
pub use string::{write_escaped_chars, write_escaped_str, Chars, JsonStr};
pub use value::{JsonType, ObjectIter, RawJson};

pub(crate) use lex::{Lexer, NumberToken};
