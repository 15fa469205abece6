//! Types both sides share: time, peers, bounded names, and the reasons a
//! message is ignored.

use core::fmt;
use core::ops::Add;
use core::time::Duration;

use crate::json::{JsonStr, RawJson};

/// A request's manifest and scalar fields, stored back to back in its chunk
/// of a `nested` byte table (copies of validated JSON).
pub(crate) fn nested_json(
    nested: &[u8],
    base: usize,
    manifest_len: usize,
    scalars_len: usize,
) -> (RawJson<'_>, RawJson<'_>) {
    let text = |from: usize, len: usize| {
        nested
            .get(base + from..base + from + len)
            .and_then(|b| core::str::from_utf8(b).ok())
            .map_or(RawJson::EMPTY_OBJECT, RawJson::from_validated)
    };
    (text(0, manifest_len), text(manifest_len, scalars_len))
}

/// A point in time, in nanoseconds since an origin the caller chooses.
/// State machines never read a clock; every call takes `now`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

/// A control-plane peer, as the caller's transport names it (a socket
/// identity, a connection index). Messages come from and go to peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

/// A string that does not fit its bounded storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextTooLong {
    /// Bytes it needs.
    pub len: usize,
    /// Bytes there are.
    pub capacity: usize,
}

impl fmt::Display for TextTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, at most {} fit", self.len, self.capacity)
    }
}

/// An owned string of at most `N` bytes: request ids, session ids, roles.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Text<const N: usize> {
    len: usize,
    buf: [u8; N],
}

impl<const N: usize> Text<N> {
    /// The empty string.
    pub const EMPTY: Self = Self {
        len: 0,
        buf: [0; N],
    };

    /// A copy of `s`.
    pub fn new(s: &str) -> Result<Self, TextTooLong> {
        let mut t = Self::EMPTY;
        let dst = t.buf.get_mut(..s.len()).ok_or(TextTooLong {
            len: s.len(),
            capacity: N,
        })?;
        dst.copy_from_slice(s.as_bytes());
        t.len = s.len();
        Ok(t)
    }

    /// The decoded value of `s`.
    pub fn from_json(s: JsonStr<'_>) -> Result<Self, TextTooLong> {
        let mut t = Self::EMPTY;
        let n = s
            .unescape_into(&mut t.buf)
            .map_err(|e| TextTooLong {
                len: e.needed,
                capacity: N,
            })?
            .len();
        t.len = n;
        Ok(t)
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Built only from `&str` and unescaped JSON strings: always UTF-8.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }

    /// The string as a wire value.
    pub fn as_json(&self) -> JsonStr<'_> {
        JsonStr::plain(self.as_str())
    }

    /// True if `s` decodes to this string.
    #[inline]
    pub fn eq_json(&self, s: JsonStr<'_>) -> bool {
        match s.as_plain() {
            // The common case, and the hot one in table scans: bytes.
            Some(plain) => plain.as_bytes() == &self.buf[..self.len],
            None => s.eq_str(self.as_str()),
        }
    }

    /// True if the string is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const N: usize> fmt::Debug for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> fmt::Display for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that ended, remembered so that late and duplicated messages
/// about it are ignored. The same request id passes through every leg of the
/// pipeline, so an id alone does not name what ended: the tag does (the
/// coordinator keeps the sender's role, an instance the side it played).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Tombstone {
    id: super::coordinator::RequestId,
    tag: u8,
}

impl Tombstone {
    /// No request.
    pub const EMPTY: Self = Self {
        id: super::coordinator::RequestId::EMPTY,
        tag: 0,
    };

    pub(crate) fn new(id: super::coordinator::RequestId, tag: u8) -> Self {
        Self { id, tag }
    }

    pub(crate) fn is(&self, id: crate::json::JsonStr<'_>, tag: u8) -> bool {
        !self.id.is_empty() && self.tag == tag && self.id.eq_json(id)
    }
}

/// A ring of tombstones over caller storage, newest overwriting oldest.
#[derive(Debug)]
pub(crate) struct Graveyard<'s> {
    stones: &'s mut [Tombstone],
    next: usize,
}

impl<'s> Graveyard<'s> {
    pub(crate) fn new(stones: &'s mut [Tombstone]) -> Self {
        stones.iter_mut().for_each(|t| *t = Tombstone::EMPTY);
        Self { stones, next: 0 }
    }

    pub(crate) fn contains(&self, id: crate::json::JsonStr<'_>, tag: u8) -> bool {
        self.stones.iter().any(|t| t.is(id, tag))
    }

    pub(crate) fn bury(&mut self, id: super::coordinator::RequestId, tag: u8) {
        if let Some(t) = self.stones.get_mut(self.next) {
            *t = Tombstone::new(id, tag);
            self.next = (self.next + 1) % self.stones.len();
        }
    }
}

/// Why a message was ignored: it changed nothing, and nothing is owed in
/// reply. Returned by `handle` so that callers can count and log them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ignored {
    /// A message type this side never receives.
    UnexpectedType,
    /// The request is not known here (finished long ago, never seen).
    UnknownRequest,
    /// The request was aborted, or already ended here; this is a late or
    /// duplicated message about it.
    Aborted,
    /// The request is known but not in a state where this message applies
    /// (a duplicate, or out of order).
    WrongState,
    /// The message comes from a peer or session that is not part of the
    /// request (an old session, a stranger).
    WrongPeer,
    /// The sender is not registered.
    NotRegistered,
    /// A duplicate of a message already acted on.
    Duplicate,
    /// A field is out of range (a size that does not fit, an address
    /// outside a pool, an unknown slot).
    BadField(&'static str),
    /// An id or name longer than this side stores.
    TooLong(&'static str),
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnexpectedType => f.write_str("message type not expected here"),
            Self::UnknownRequest => f.write_str("unknown request"),
            Self::Aborted => f.write_str("request was aborted or has ended"),
            Self::WrongState => f.write_str("request is not in a state this message applies to"),
            Self::WrongPeer => {
                f.write_str("message from a peer or session not part of the request")
            }
            Self::NotRegistered => f.write_str("peer not registered"),
            Self::Duplicate => f.write_str("duplicate"),
            Self::BadField(name) => write!(f, "field `{name}` out of range"),
            Self::TooLong(name) => write!(f, "field `{name}` too long"),
        }
    }
}
