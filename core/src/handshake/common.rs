//! Types both sides share: time, peers, bounded names and request ids, the
//! legs of a request, and the reasons a message is ignored.

use core::fmt;
use core::ops::Add;
use core::time::Duration;

use super::parts::GraveyardStorage;
use super::tables::hash::HashKey;
use super::tables::index::Index;
use crate::json::{JsonStr, RawJson};
use crate::managed::ManagedSlice;

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

/// Longest request id stored.
pub const ID_LEN: usize = 64;
/// Longest session id or endpoint stored.
pub const NAME_LEN: usize = 128;

/// A request id.
pub type RequestId = Text<ID_LEN>;
/// A session id or endpoint.
pub type Name = Text<NAME_LEN>;

/// Longest failure reason an instance reports (`transfer_pushed.error`,
/// `transfer_done.error`); longer texts are cut.
pub const REASON_LEN: usize = 192;

/// A failure reason: a data plane's own error text, or the application's.
pub type Reason = Text<REASON_LEN>;

/// The side of a leg an instance plays. The same request id passes through
/// every leg, so a denoiser may hold a request as receiver (of the
/// encoder's leg) and as sender (of its own) at once; the side tells them
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// It stages and writes the request's bytes.
    Send,
    /// It receives them into a slot of its pool.
    Recv,
}

/// Which leg of a request a record is about: the same id names a request
/// on every leg of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Leg {
    /// At the coordinator: the leg whose sender has the role at this index
    /// of the pipeline.
    FromRole(usize),
    /// At an instance: the side it played.
    Side(Side),
}

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

impl core::error::Error for TextTooLong {}

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

    /// As much of `s` as fits, cut at a character boundary: for texts
    /// (error reasons) where a bounded prefix is better than nothing.
    pub fn truncated(s: &str) -> Self {
        let mut t = Self::EMPTY;
        t.push_truncated(s);
        t
    }

    /// The decoded value of `s`, as much of it as fits, cut at a character
    /// boundary: a peer's words (a reason, an error), kept whatever their
    /// length.
    pub(crate) fn from_json_truncated(s: JsonStr<'_>) -> Self {
        let mut t = Self::EMPTY;
        let mut utf8 = [0u8; 4];
        for c in s.chars() {
            if t.len == N {
                break;
            }
            t.push_truncated(c.encode_utf8(&mut utf8));
        }
        t
    }

    /// Appends as much of `s` as fits, cut at a character boundary.
    pub(crate) fn push_truncated(&mut self, s: &str) {
        let room = N - self.len;
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
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

    /// The string's bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
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

/// Formatting into a `Text` keeps what fits and drops the rest (cut at a
/// character boundary) without failing, so that an error's whole
/// `Display` can be written into a bounded reason.
impl<const N: usize> fmt::Write for Text<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_truncated(s);
        Ok(())
    }
}

impl<const N: usize> fmt::Display for Text<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that ended, remembered so that late and duplicated messages
/// about it are ignored. The same request id passes through every leg of the
/// pipeline, so an id alone does not name what ended: the leg does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tombstone {
    id: RequestId,
    leg: Leg,
    /// Who ended it, for telling a duplicate (the same owner) from a reuse
    /// of the id (another): the coordinator's sender registration epoch.
    owner: u32,
    /// The hash it is indexed under.
    hash: u64,
}

impl Default for Tombstone {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl Tombstone {
    /// No request.
    pub const EMPTY: Self = Self {
        id: RequestId::EMPTY,
        leg: Leg::FromRole(0),
        owner: 0,
        hash: 0,
    };

    pub(crate) fn is(&self, id: JsonStr<'_>, leg: Leg) -> bool {
        !self.id.is_empty() && self.leg == leg && self.id.eq_json(id)
    }
}

/// The namespace a leg's tombstones are hashed in.
fn leg_ns(leg: Leg) -> u64 {
    match leg {
        Leg::FromRole(r) => r as u64,
        Leg::Side(Side::Send) => 1 << 32,
        Leg::Side(Side::Recv) => 2 << 32,
    }
}

/// A ring of tombstones over caller storage, newest overwriting oldest,
/// indexed by the hash of id and leg.
#[derive(Debug)]
pub(crate) struct Graveyard<'s> {
    stones: ManagedSlice<'s, Tombstone>,
    index: Index<'s>,
    key: HashKey,
    next: usize,
}

impl<'s> Graveyard<'s> {
    pub(crate) fn new(storage: GraveyardStorage<'s>, key: HashKey) -> Self {
        let GraveyardStorage { mut stones, index } = storage;
        stones.iter_mut().for_each(|t| *t = Tombstone::EMPTY);
        Self {
            stones,
            index: Index::new(index),
            key,
            next: 0,
        }
    }

    /// Places the index read so far.
    pub(crate) fn probes(&self) -> u64 {
        self.index.probes()
    }

    /// Whether `id`'s `leg` has a tombstone, and whether one of them was
    /// laid by `owner`: one walk of the index.
    pub(crate) fn lookup(&self, id: JsonStr<'_>, leg: Leg, owner: u32) -> (bool, bool) {
        let Some(hash) = self.key.json::<ID_LEN>(id, leg_ns(leg)) else {
            return (false, false);
        };
        let mut any = false;
        let by_owner = self
            .index
            .find(hash, |i| {
                let found = self.stones.get(i).filter(|t| t.is(id, leg));
                any |= found.is_some();
                found.is_some_and(|t| t.owner == owner)
            })
            .is_some();
        (any, by_owner)
    }

    pub(crate) fn contains(&self, id: JsonStr<'_>, leg: Leg) -> bool {
        let Some(hash) = self.key.json::<ID_LEN>(id, leg_ns(leg)) else {
            return false;
        };
        self.index
            .find(hash, |i| self.stones.get(i).is_some_and(|t| t.is(id, leg)))
            .is_some()
    }

    pub(crate) fn bury(&mut self, id: RequestId, leg: Leg) {
        self.bury_owned(id, leg, 0);
    }

    pub(crate) fn bury_owned(&mut self, id: RequestId, leg: Leg, owner: u32) {
        let i = self.next;
        let Some(old) = self.stones.get(i).copied() else {
            return;
        };
        // (An empty ring place has no entry: the removal finds none.)
        self.index.remove(old.hash, i);
        let hash = self.key.bytes(id.as_bytes(), leg_ns(leg));
        self.stones[i] = Tombstone {
            id,
            leg,
            owner,
            hash,
        };
        // A probe sequence crowded by ids someone chose to collide: this
        // stone goes unfound, and a late duplicate of it is judged as new.
        let _ = self.index.insert(hash, i);
        self.next = (i + 1) % self.stones.len();
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
    /// A registration from an endpoint the admission list does not name.
    NotAdmitted,
    /// The instance left (`Instance::leave`): nothing reaches it any more.
    Left,
    /// The coordinator's peer table has no place for a new endpoint (it
    /// has none at all, or, against a secret hash key, none its index can
    /// reach).
    PeerTableFull,
    /// The message came on a connection authenticated as someone other
    /// than the instance it speaks for registered as (another CURVE key),
    /// or a registration would take over an endpoint registered under
    /// another key.
    WrongKey,
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
            Self::Left => f.write_str("the instance left"),
            Self::NotAdmitted => f.write_str("endpoint not admitted for its role"),
            Self::PeerTableFull => f.write_str("no place in the peer table"),
            Self::WrongKey => f.write_str(
                "message from a connection whose key is not the one its instance registered with",
            ),
        }
    }
}

impl core::error::Error for Ignored {}
