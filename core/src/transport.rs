//! The two seams between the state machines and the outside world: the data
//! plane ([`Transport`]: register memory, post one-sided writes and reads,
//! poll their completions) and the control channel ([`ControlSend`] and
//! [`ControlRecv`]: send and receive the protocol's two-frame messages).
//! They are separate so that any control plane pairs with any data plane.
//! These three traits, and [`Fault`] for their errors, are all an embedder
//! implements; how a caller waits on them (file descriptors) is a set of
//! default methods that exist only with the `std` feature, so that the
//! no_std core holds no blocking contract.
//!
//! Both contracts are allocation-free: writes are named by a caller cookie,
//! messages are received into a caller buffer, and errors are typed values
//! that say what kind of failure they are ([`Fault`]), so that the runtime
//! can act on them (fail one request, drop one peer) without knowing the
//! backend.
// Only the declaration of `Transport::register` is unsafe: registering
// memory hands its lifetime to the caller, which no safe signature can say.
#![allow(unsafe_code)]

use core::fmt;
use core::time::Duration;

/// What kind of failure an error is, whatever backend raised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// The peer is gone: its process exited, its endpoint or memory object
    /// vanished, its connection was refused.
    PeerGone,
    /// The peer's session id or endpoint names nothing this backend can
    /// reach, or cannot be parsed.
    UnknownPeer,
    /// A write's source or destination lies outside registered memory.
    OutOfBounds,
    /// A message or write is larger than the backend can carry.
    TooLarge,
    /// The peer did not take the message or write in time (its queue is
    /// full, or the write was ended unfinished when its time ran out).
    Timeout,
    /// A registration failed (bad range, resources exhausted).
    Registration,
    /// Any other operating-system or library error.
    Io,
}

impl FaultKind {
    /// A short reason, as sent in `transfer_pushed.error` or
    /// `transfer_done.error`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PeerGone => "peer gone",
            Self::UnknownPeer => "unknown peer",
            Self::OutOfBounds => "write outside registered memory",
            Self::TooLarge => "too large",
            Self::Timeout => "timed out",
            Self::Registration => "memory registration failed",
            Self::Io => "i/o error",
        }
    }

    /// What kind of failure an errno (Linux's numbering, positive; also
    /// libfabric's `FI_E*` values, which equal them) is, for an error that
    /// concerns one peer or one write. The RDMA data planes classify by
    /// this one table.
    pub const fn of_errno(errno: i32) -> Self {
        match errno {
            errno::ECONNREFUSED
            | errno::ECONNRESET
            | errno::ECONNABORTED
            | errno::EHOSTUNREACH
            | errno::ENETUNREACH
            | errno::EHOSTDOWN
            | errno::ENETDOWN
            | errno::ENOTCONN
            | errno::ESHUTDOWN
            | errno::EADDRNOTAVAIL
            | errno::EPIPE => Self::PeerGone,
            errno::ETIMEDOUT => Self::Timeout,
            errno::EMSGSIZE | errno::E2BIG | errno::EOVERFLOW => Self::TooLarge,
            errno::EACCES | errno::EKEYREJECTED | errno::EFAULT => Self::OutOfBounds,
            _ => Self::Io,
        }
    }
}

/// The errno values [`FaultKind::of_errno`] knows, as Linux numbers them
/// (the crate has no libc; the backends' tests check these against it).
pub mod errno {
    /// Argument list too long.
    pub const E2BIG: i32 = 7;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Permission denied (a remote key refused).
    pub const EACCES: i32 = 13;
    /// Broken pipe.
    pub const EPIPE: i32 = 32;
    /// Value too large for the type.
    pub const EOVERFLOW: i32 = 75;
    /// Message too long.
    pub const EMSGSIZE: i32 = 90;
    /// Address not available.
    pub const EADDRNOTAVAIL: i32 = 99;
    /// Network is down.
    pub const ENETDOWN: i32 = 100;
    /// Network is unreachable.
    pub const ENETUNREACH: i32 = 101;
    /// Connection aborted.
    pub const ECONNABORTED: i32 = 103;
    /// Connection reset by peer.
    pub const ECONNRESET: i32 = 104;
    /// Not connected.
    pub const ENOTCONN: i32 = 107;
    /// Endpoint shut down.
    pub const ESHUTDOWN: i32 = 108;
    /// Timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
    /// Host is down.
    pub const EHOSTDOWN: i32 = 112;
    /// No route to host.
    pub const EHOSTUNREACH: i32 = 113;
    /// Key rejected (libfabric: a bad memory key).
    pub const EKEYREJECTED: i32 = 129;
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one table of fault kinds: their names (as telemetry labels them and
/// Python's `FerryError.kind` carries them) and their codes (as sglang's
/// `transfer_sync` returns them). Every other layer reads them from here.
impl FaultKind {
    /// Every kind, by code from -2 down, and `Io` (-1, the catch-all)
    /// last.
    pub const ALL: [FaultKind; 7] = [
        Self::UnknownPeer,
        Self::OutOfBounds,
        Self::PeerGone,
        Self::Timeout,
        Self::TooLarge,
        Self::Registration,
        Self::Io,
    ];

    /// Its name in snake case (`peer_gone`, `timeout`, ...): a metric's
    /// label value, Python's `FerryError.kind`.
    pub const fn as_name(self) -> &'static str {
        match self {
            Self::PeerGone => "peer_gone",
            Self::UnknownPeer => "unknown_peer",
            Self::OutOfBounds => "out_of_bounds",
            Self::TooLarge => "too_large",
            Self::Timeout => "timeout",
            Self::Registration => "registration",
            Self::Io => "io",
        }
    }

    /// What a failed transfer of this kind returns through sglang's
    /// engine contract (`transfer_sync`): always negative, 0 being success.
    pub const fn code(self) -> i32 {
        match self {
            Self::Io => -1,
            Self::UnknownPeer => -2,
            Self::OutOfBounds => -3,
            Self::PeerGone => -4,
            Self::Timeout => -5,
            Self::TooLarge => -6,
            Self::Registration => -7,
        }
    }

    /// The kind named `name` ([`FaultKind::as_name`]), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_name() == name)
    }
}

/// An error a backend returns: displayable, and of a known kind.
pub trait Fault: core::error::Error {
    /// What kind of failure this is.
    fn kind(&self) -> FaultKind;
}

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
    type Error: Fault;

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
    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, Self::Error>;

    /// Ends a registration.
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

/// A received control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming<'b> {
    /// The sender's endpoint, if the channel knows it (empty otherwise). A
    /// coordinator keeps endpoints of at most 128 bytes
    /// (`handshake::NAME_LEN`): a longer one names no one.
    pub from: &'b str,
    /// The local endpoint it arrived at (a coordinator with one endpoint
    /// per role learns the sender's role from it).
    pub via: &'b str,
    /// Frame 0: `__transfer__` for transfer messages.
    pub magic: &'b [u8],
    /// Frame 1: the JSON payload.
    pub payload: &'b [u8],
}

/// What the receiving side of a control channel saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelEvent<'b> {
    /// A message.
    Message(Incoming<'b>),
    /// A peer's connection closed: its process exited or it shut down.
    /// Channels that cannot tell never report it.
    Gone {
        /// The peer's endpoint.
        from: &'b str,
    },
}

/// The sending side of a control channel.
pub trait ControlSend {
    /// Its errors.
    type Error: Fault;

    /// Sends `parts` as one message to the endpoint `to`: all of them, or
    /// none. The protocol's messages are two frames,
    /// `send(to, &[magic, payload])`; an application's own messages on the
    /// protocol's sockets may have any number (sglang's decoder returns its
    /// output to the head as a JSON descriptor frame, then one frame per
    /// tensor). A channel whose wire carries only two frames refuses other
    /// counts with an error.
    fn send(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), Self::Error>;
}

/// The receiving side of a control channel.
pub trait ControlRecv {
    /// Its errors.
    type Error: Fault;

    /// The endpoint peers send to.
    fn local_endpoint(&self) -> &str;

    /// Receives the next message into `buf`, waiting at most `wait` for one
    /// (zero: do not wait). `Ok(None)`: nothing arrived in time. An error
    /// concerns one message or peer; the channel goes on working.
    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
    ) -> Result<Option<ChannelEvent<'b>>, Self::Error>;

    /// True if [`recv_or_wake`](Self::recv_or_wake) wakes on its
    /// descriptor (the default: it does not).
    #[cfg(feature = "std")]
    fn can_wake(&self) -> bool {
        false
    }

    /// Like [`recv`](Self::recv), and also returns `Ok(None)` as soon as
    /// `wake` (a data plane's [`Transport::wake_fd`]) is readable, so that
    /// one thread waits on both. Channels whose
    /// [`can_wake`](Self::can_wake) is false wait as `recv` does (the
    /// default), and their callers must bound `wait`.
    #[cfg(feature = "std")]
    fn recv_or_wake<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: std::os::fd::RawFd,
    ) -> Result<Option<ChannelEvent<'b>>, Self::Error> {
        let _ = wake;
        self.recv(buf, wait)
    }
}

/// A control channel as one value that splits into its sending and
/// receiving side, so that a runtime can block in `recv` on one thread
/// while others send. Any pair `(sender, receiver)` is one already: an
/// embedder implements [`ControlSend`] and [`ControlRecv`] and passes the
/// pair; a backend whose sides are made together (a bound socket) may
/// implement this for the convenience of its callers.
pub trait ControlChannel {
    /// The sending side.
    type Sender: ControlSend + Send;
    /// The receiving side.
    type Receiver: ControlRecv + Send;

    /// Splits the channel.
    fn split(self) -> (Self::Sender, Self::Receiver);
}

impl<S: ControlSend + Send, R: ControlRecv + Send> ControlChannel for (S, R) {
    type Sender = S;
    type Receiver = R;

    fn split(self) -> (S, R) {
        self
    }
}
