//! What an instance's caller sees: the writes it posts, the events it
//! reads, a received transfer, the errors its calls return, and the
//! counters.

use super::*;

/// A write for the caller's data plane to post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// Pass back to [`Instance::handle_completion`].
    pub token: Token,
    /// The request.
    pub id: RequestId,
    /// Offset of the bytes in this instance's pool.
    pub local_offset: u64,
    /// Bytes to write.
    pub len: u64,
    /// The receiver's data-plane session.
    pub dest_session: Name,
    /// Destination address in the receiver's address space.
    pub dest_addr: u64,
    /// The write's name for receivers whose data plane reports arrivals
    /// ([`InstanceIdentity::delivery_complete`] false): sender and receiver both compute it
    /// from the request id and the destination address.
    pub tag: WriteTag,
}

/// Where the instance stands with its coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Registering (at start, or again after losing the coordinator):
    /// nothing else is sent until it is acknowledged.
    Pending,
    /// The coordinator accepted it.
    Accepted,
    /// The coordinator refused it (an unknown role, say).
    Refused,
    /// Sent to a coordinator that does not answer registrations
    /// ([`Head::Sglang`]): the instance is usable.
    Sent,
}

/// How long a sent request waited and how long its write took, on the
/// instance's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendTiming {
    /// Committed (`transfer_staged` queued) to `transfer_push` received:
    /// the wait for the coordinator to find a receiver with room.
    pub queued: Duration,
    /// `transfer_push` received to the write's completion: the write.
    pub written: Duration,
}

/// What the application should know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceEvent {
    /// The coordinator accepted the registration.
    Registered,
    /// The coordinator refused the registration.
    Refused,
    /// A transfer arrived: read it with [`Instance::received`], then
    /// [`Instance::release`] it.
    Received(Token),
    /// A request this instance staged was written to its receiver.
    Sent {
        /// The request.
        id: RequestId,
        /// How long it waited, and how long its write took.
        timing: SendTiming,
    },
    /// A request this instance staged will not be delivered.
    SendFailed {
        /// The request.
        id: RequestId,
        /// Why: the coordinator's abort reason, the write's error, or the
        /// local cause (a timeout, the coordinator lost).
        reason: Reason,
    },
    /// A transfer the application holds was aborted by the coordinator;
    /// release it when done reading (its slot is freed then).
    Aborted(Token),
}

/// A received transfer, as the application reads it.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a> {
    /// The request.
    pub id: &'a str,
    /// Where the slot starts in the pool.
    pub slot_offset: u64,
    /// The slot's size (every tensor of the manifest lies inside it).
    pub slot_size: u64,
    /// Where each tensor lies in the slot (checked against its size).
    pub manifest: Manifest<'a>,
    /// Scalar fields relayed from the sender.
    pub scalar_fields: RawJson<'a>,
    /// The coordinator aborted the request since it was delivered: nobody
    /// waits for its result (releasing it still frees the slot).
    pub aborted: bool,
}

/// Why the application's call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstanceError {
    /// The pool has no room (or the size is zero or too large).
    Pool(BuddyError),
    /// The request table is full.
    TableFull,
    /// The request id is in use, or longer than [`RequestId`] holds.
    BadId,
    /// The token names no request in the state the call needs.
    StaleToken,
    /// Manifest and scalar fields exceed the storage of one request.
    TooLarge,
    /// The pool is too small for the preallocated slots asked for.
    Prealloc(BuddyError),
    /// The preallocated slots could not be indexed by offset (storage of
    /// the wrong length is [`InstanceError::Storage`] instead).
    PreallocStorage {
        /// Slots asked for.
        needed: usize,
    },
    /// Settings the pool cannot take.
    Config(BuddyError),
    /// Storage not as long as its part needs ([`InstanceStorage::storage_needed`]).
    Storage(StorageError),
    /// A name in the settings is too long.
    NameTooLong,
    /// The request table is larger than a token can index.
    TooManyRequests {
        /// The most it may hold.
        max: usize,
    },
    /// The instance drains or has left ([`Instance::drain`]): it takes no
    /// new request.
    Draining,
    /// The quarantine is shorter than a write may take to land
    /// ([`InstanceConfig::quarantine_needed`]): a failed request's write
    /// could land in the slot's next tenant.
    QuarantineTooShort {
        /// The quarantine configured.
        quarantine: Duration,
        /// What the data plane's write lifetime and the message delay need.
        needed: Duration,
    },
}

impl fmt::Display for InstanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pool(e) => write!(f, "pool: {e}"),
            Self::TableFull => f.write_str("request table full"),
            Self::BadId => f.write_str("request id in use or too long"),
            Self::StaleToken => f.write_str("no such request in that state"),
            Self::TooLarge => f.write_str("manifest and scalar fields too large"),
            Self::Prealloc(e) => write!(f, "preallocated slots: {e}"),
            Self::PreallocStorage { needed } => {
                write!(f, "storage for {needed} preallocated slots needed")
            }
            Self::Config(e) => write!(f, "pool settings: {e}"),
            Self::Storage(e) => write!(f, "{e}"),
            Self::NameTooLong => f.write_str("a name in the settings is too long"),
            Self::TooManyRequests { max } => {
                write!(f, "a request table holds at most {max} requests")
            }
            Self::Draining => f.write_str("the instance drains: it takes no new request"),
            Self::QuarantineTooShort { quarantine, needed } => write!(
                f,
                "a quarantine of {quarantine:?} is shorter than a write may take to land ({needed:?}: the data plane's write lifetime plus the message delay); a failed request's write could land in the slot's next tenant"
            ),
        }
    }
}

impl core::error::Error for InstanceError {}

/// Counters for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceStats {
    /// Requests staged.
    pub staged: u64,
    /// Requests written to their receiver.
    pub sent: u64,
    /// Transfers received and handed to the application.
    pub received: u64,
    /// Allocations rejected.
    pub rejected: u64,
    /// Requests aborted by the coordinator.
    pub aborted: u64,
    /// Requests dropped by a local timeout.
    pub timed_out: u64,
    /// Requests forwarded (received, then staged for the next leg in one
    /// message).
    pub forwarded: u64,
    /// `transfer_alloc`s held for lack of room (under [`Head::Sglang`]).
    pub allocs_held: u64,
    /// Transfers announced ready whose write was not seen to land in time
    /// (see [`InstanceConfig::landing_timeout`]).
    pub never_landed: u64,
    /// Arrivals forgotten before their time to make room for newer ones
    /// (more writes landed ahead of their `transfer_ready` than requests
    /// fit in the table).
    pub arrivals_dropped: u64,
    /// Messages ignored.
    pub ignored: u64,
    /// Messages, actions or events that found their queue full.
    pub dropped: u64,
}
