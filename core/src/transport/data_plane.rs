//! The data plane's contract ([`Transport`]) and what it speaks of: the
//! regions it registers, the writes and reads it posts, their completions,
//! the tags that name a write to a receiver that counts arrivals, and what
//! a data plane offers.
// Only the declaration of `Transport::register` is unsafe: registering
// memory hands its lifetime to the caller, which no safe signature can say.
#![allow(unsafe_code)]

use core::fmt;
use core::time::Duration;

use super::FaultKind;

/// What a data plane offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The largest single write it posts (bigger writes are split by the
    /// backend).
    pub max_write: u64,
    /// True if a successful completion means the bytes are visible at the
    /// target (delivery complete), not only that the source may be reused.
    /// When false, the receiving side reports each write whose bytes all
    /// arrived ([`Transport::poll_landed`]), and a receiver accepts a
    /// transfer as ready only once its write is reported.
    pub delivery_complete: bool,
    /// How long after it is posted a write's bytes may still land at the
    /// peer, at most: the data plane's own write timeout plus the time it
    /// takes to end a write that ran out of it. Zero where a write is made
    /// within the call that posts or polls it. A receiver keeps a slot
    /// that a failed request's write may still land in out of use for at
    /// least this long (the instance's quarantine is checked against it
    /// when it starts).
    pub write_lifetime: Duration,
}

/// A registered memory region, as the transport names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The transport's name for it.
    pub id: u32,
    /// Its first byte in this process.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl Region {
    /// Checks a write's source, `len` bytes at `offset` in this region,
    /// the one bounds check every data plane makes before it posts.
    pub const fn check_source(&self, offset: u64, len: u64) -> Result<(), RegionError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RegionError::SourceOutOfBounds {
                region: self.id,
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

/// What every data plane refuses about its own registered regions, in one
/// vocabulary (each backend's error wraps it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// A region that is not (or no longer) registered.
    Unknown(u32),
    /// A write's source lies outside its registered region.
    SourceOutOfBounds {
        /// The region.
        region: u32,
        /// The offset in it.
        offset: u64,
        /// The write's length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// More regions than the data plane can tell its peers of.
    TooMany {
        /// The most regions it registers.
        max: usize,
    },
}

impl RegionError {
    /// What kind of failure it is: a write outside registered memory, or
    /// (too many regions) a registration refused.
    pub const fn kind(&self) -> FaultKind {
        match self {
            Self::Unknown(_) | Self::SourceOutOfBounds { .. } => FaultKind::OutOfBounds,
            Self::TooMany { .. } => FaultKind::Registration,
        }
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "region {id} is not registered"),
            Self::SourceOutOfBounds {
                region,
                offset,
                len,
                region_len,
            } => write!(
                f,
                "write of {len} bytes at offset {offset} falls outside region {region} ({region_len} bytes)"
            ),
            Self::TooMany { max } => {
                write!(f, "{max} regions are registered already; a transport registers at most {max}")
            }
        }
    }
}

impl core::error::Error for RegionError {}

/// Names one write, for data planes whose receivers must count a write's
/// arrival before they accept `transfer_ready` (see
/// [`Capabilities::delivery_complete`]). Sender and receiver compute it from
/// what both know: the request id and the destination address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteTag(pub u64);

impl WriteTag {
    /// The tag of the write of request `request_id` to `dest_addr` (an
    /// address in the receiver's space): FNV-1a over the id, folded with
    /// the address and finished with a 64-bit mixer, so that every bit of
    /// both reaches the low bits a narrow notice keeps.
    pub fn of(request_id: &str, dest_addr: u64) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in request_id.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= dest_addr.rotate_left(29);
        h ^= h >> 30;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        Self(h)
    }
}

/// A write whose every byte arrived at this receiver, as a data plane that
/// reports arrivals names it: the low `width` bits of its [`WriteTag`]
/// (some fabrics carry fewer bits with a write than a tag has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Landed {
    bits: u64,
    width: u8,
}

impl Landed {
    /// The write tagged `tag`, named by all its bits.
    pub const fn of(tag: WriteTag) -> Self {
        Self {
            bits: tag.0,
            width: 64,
        }
    }

    /// A write named by the low `width` bits of its tag (`value`'s bits
    /// above them are ignored; `width` is clamped to 1..=64).
    pub const fn low_bits(value: u64, width: u32) -> Self {
        let width = if width == 0 {
            1
        } else if width > 64 {
            64
        } else {
            width
        };
        Self {
            bits: value & mask(width),
            width: width as u8,
        }
    }

    /// The low 16 bits of the tag it names, if it carries that many: what
    /// an instance indexes writes awaiting their arrival by.
    pub(crate) const fn low16(self) -> Option<u64> {
        if self.width >= 16 {
            Some(self.bits & 0xffff)
        } else {
            None
        }
    }

    /// True if this names the write tagged `tag`.
    pub const fn matches(self, tag: WriteTag) -> bool {
        tag.0 & mask(self.width as u32) == self.bits
    }
}

/// The low `width` bits set (`width` in 1..=64).
const fn mask(width: u32) -> u64 {
    u64::MAX >> (64 - width)
}

/// One write for a data plane to post: `len` bytes at `local_offset` in
/// `region` to `dest_addr` in the address space of the peer whose session
/// id is `dest_session`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOp<'a> {
    /// The registered region the bytes come from.
    pub region: Region,
    /// Where in `region` they start.
    pub local_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The receiving peer's session id.
    pub dest_session: &'a str,
    /// Where they go, as an address in the receiver's space.
    pub dest_addr: u64,
    /// The write's name for a receiver whose data plane reports arrivals
    /// (see [`Capabilities::delivery_complete`]).
    pub tag: WriteTag,
    /// Comes back in the write's [`Completion`].
    pub cookie: u64,
}

/// One read for a data plane to post (a one-sided read, the mirror of a
/// [`WriteOp`]): `len` bytes at `src_addr` in the registered memory of the
/// peer whose session id is `src_session`, into `local_offset` in
/// `region`. The peer takes no part; the data plane checks `region`'s
/// bounds here and the peer's registration there, as for a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOp<'a> {
    /// The registered region the bytes go into.
    pub region: Region,
    /// Where in `region` they go.
    pub local_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The peer whose memory is read.
    pub src_session: &'a str,
    /// Where they come from, as an address in the peer's space.
    pub src_addr: u64,
    /// Comes back in the read's [`Completion`].
    pub cookie: u64,
}

/// What a write and a read share, seen from the side that posts it: a
/// span of one of its registered regions (a write's source, a read's
/// destination) and an address in a peer's memory (a write's destination,
/// a read's source). For data planes that check and post both alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSpan<'a> {
    /// The registered region.
    pub region: Region,
    /// Where in `region` the bytes start.
    pub local_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The peer's session id.
    pub peer: &'a str,
    /// Where the bytes are in the peer's address space.
    pub remote_addr: u64,
    /// Comes back in the op's [`Completion`].
    pub cookie: u64,
}

impl<'a> WriteOp<'a> {
    /// The write's span: its source here, its destination at the peer.
    pub const fn span(&self) -> OpSpan<'a> {
        OpSpan {
            region: self.region,
            local_offset: self.local_offset,
            len: self.len,
            peer: self.dest_session,
            remote_addr: self.dest_addr,
            cookie: self.cookie,
        }
    }
}

impl<'a> ReadOp<'a> {
    /// The read's span: its destination here, its source at the peer.
    pub const fn span(&self) -> OpSpan<'a> {
        OpSpan {
            region: self.region,
            local_offset: self.local_offset,
            len: self.len,
            peer: self.src_session,
            remote_addr: self.src_addr,
            cookie: self.cookie,
        }
    }
}

/// A finished write or read.
#[derive(Debug)]
pub struct Completion<E> {
    /// The cookie it was posted with.
    pub cookie: u64,
    /// Whether the bytes arrived: at the peer for a write (where
    /// completions mean delivery), in this process's region for a read.
    pub result: Result<(), E>,
}

/// The data plane: one-sided writes from this process's registered memory
/// into a peer's, and one-sided reads the other way.
pub trait Transport {
    /// Its errors.
    type Error: core::error::Error;

    /// What kind of failure `error` is, so that the runtime acts on it
    /// (fail one request, drop one peer) without knowing the backend.
    fn fault_kind(error: &Self::Error) -> FaultKind;

    /// The session id peers address this transport by (the protocol's
    /// `session_id`).
    fn session_id(&self) -> &str;

    /// What it offers.
    fn capabilities(&self) -> Capabilities;

    /// Registers `len` bytes at `addr` so that peers may write into them and
    /// this process may write from them.
    ///
    /// # Safety
    /// The memory must stay mapped and must not be freed or reused until
    /// the region is deregistered or the transport dropped, and the caller
    /// must expect peers to write into it at any time: no reference that
    /// assumes the bytes do not change may be held over memory a peer was
    /// told it may write.
    ///
    /// What the implementor promises in return, which callers rely on to
    /// free the memory: once [`deregister`](Self::deregister) returns `Ok`
    /// for the region, or once the transport is dropped, nothing the
    /// transport started touches the range any more (no peer's write
    /// lands in it, no read fills it, no thread of its own copies from
    /// it). A transport that cannot be sure of that by then waits for it,
    /// or fails `deregister` (and, when dropped, waits).
    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, Self::Error>;

    /// Ends a registration: when it returns `Ok`, nothing the transport
    /// started touches the region's memory any more (see
    /// [`register`](Self::register)). An error means the memory may still
    /// be touched and must be kept.
    fn deregister(&mut self, region: Region) -> Result<(), Self::Error>;

    /// Posts `write`. Its outcome comes from
    /// [`poll_completion`](Self::poll_completion) with its cookie; an error
    /// here means it was not posted.
    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), Self::Error>;

    /// Posts `read`. Its outcome comes from
    /// [`poll_completion`](Self::poll_completion) with its cookie, as a
    /// write's does; a successful completion means every byte is in this
    /// process's region. An error here means it was not posted (a data
    /// plane that cannot read says so with an error of kind
    /// [`FaultKind::Io`]).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), Self::Error>;

    /// The next finished write, if any.
    ///
    /// A completion is final, whatever it says: once a write's completion
    /// is handed out, none of its bytes is read from its source any more
    /// (its caller may reuse it), and, where completions mean delivery
    /// ([`Capabilities::delivery_complete`]), no byte of it is sent that
    /// the peer's memory has not received. A data plane that fails a write
    /// on its own (its write timeout, a broken connection) first ends it,
    /// as [`cancel_transfers`](Self::cancel_transfers) does. Bytes a peer's
    /// host already holds for it may still be placed once the peer drives
    /// its queue (a byte stream's receive buffer): a data plane where that
    /// can happen says so.
    fn poll_completion(&mut self) -> Option<Completion<Self::Error>>;

    /// Ends every write to and read from the peer `session` that has not
    /// completed, for a caller that gives up waiting on them: once this
    /// returns, none of them touches this process's memory or sends the
    /// peer a byte any more (see
    /// [`poll_completion`](Self::poll_completion)), and each one's
    /// completion (an error with the kind [`FaultKind::Timeout`], for
    /// those that did not finish) is queued for
    /// [`poll_completion`](Self::poll_completion). Transfers with other
    /// peers go on; the next one with this peer may connect anew. An
    /// error means the data plane could not be sure the transfers ended:
    /// their completions have not been queued, and their memory must not
    /// be reused.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), Self::Error>;

    /// On the receiving side, where completions do not mean delivery
    /// ([`Capabilities::delivery_complete`] false): the next write whose
    /// every byte became visible in this process's memory, each reported
    /// once, whether or not a transfer waits for it yet. Data planes whose
    /// completions mean delivery report nothing (the default).
    fn poll_landed(&mut self) -> Option<Landed> {
        None
    }

    /// A descriptor that is readable while
    /// [`poll_completion`](Self::poll_completion) or
    /// [`poll_landed`](Self::poll_landed) may have news, for a data plane
    /// that learns of completions on a thread of its own. It is cleared
    /// when `poll_completion` finds nothing; call `poll_landed` after that.
    /// `None` (the default): the caller polls.
    #[cfg(feature = "std")]
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}
