//! The messages of the transfer protocol, borrowed from their frame.
//!
//! Field order in each struct is the seed's dataclass order, which is the
//! order on the wire. Fields marked *extension* are ferry's compatible
//! additions (see docs/design.md): a seed-era peer ignores them, and they are
//! written only when they differ from their default.

use core::fmt;

use super::manifest::Manifest;
use super::slots::SlotList;
use crate::json::{JsonStr, RawJson};

/// The `msg_type` of a transfer message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgType {
    /// `transfer_register`: instance → coordinator.
    Register,
    /// `transfer_register_ack`: coordinator → instance.
    RegisterAck,
    /// `transfer_staged`: sender → coordinator.
    Staged,
    /// `transfer_alloc`: coordinator → receiver.
    Alloc,
    /// `transfer_allocated`: receiver → coordinator.
    Allocated,
    /// `transfer_alloc_reject` (ferry extension): receiver → coordinator.
    AllocReject,
    /// `transfer_push`: coordinator → sender.
    Push,
    /// `transfer_pushed`: sender → coordinator.
    Pushed,
    /// `transfer_ready`: coordinator → receiver.
    Ready,
    /// `transfer_done`: receiver → coordinator.
    Done,
    /// `transfer_abort` (ferry extension): coordinator → instances.
    Abort,
    /// `transfer_deregister` (ferry extension): instance → coordinator.
    Deregister,
}

impl MsgType {
    /// Every message type, in protocol order.
    pub const ALL: [MsgType; 12] = [
        Self::Register,
        Self::RegisterAck,
        Self::Staged,
        Self::Alloc,
        Self::Allocated,
        Self::AllocReject,
        Self::Push,
        Self::Pushed,
        Self::Ready,
        Self::Done,
        Self::Abort,
        Self::Deregister,
    ];

    /// The wire name, e.g. `"transfer_staged"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Register => "transfer_register",
            Self::RegisterAck => "transfer_register_ack",
            Self::Staged => "transfer_staged",
            Self::Alloc => "transfer_alloc",
            Self::Allocated => "transfer_allocated",
            Self::AllocReject => "transfer_alloc_reject",
            Self::Push => "transfer_push",
            Self::Pushed => "transfer_pushed",
            Self::Ready => "transfer_ready",
            Self::Done => "transfer_done",
            Self::Abort => "transfer_abort",
            Self::Deregister => "transfer_deregister",
        }
    }

    /// The type named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "transfer_register" => Self::Register,
            "transfer_register_ack" => Self::RegisterAck,
            "transfer_staged" => Self::Staged,
            "transfer_alloc" => Self::Alloc,
            "transfer_allocated" => Self::Allocated,
            "transfer_alloc_reject" => Self::AllocReject,
            "transfer_push" => Self::Push,
            "transfer_pushed" => Self::Pushed,
            "transfer_ready" => Self::Ready,
            "transfer_done" => Self::Done,
            "transfer_abort" => Self::Abort,
            "transfer_deregister" => Self::Deregister,
            _ => return None,
        })
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `transfer_register`: an instance announces its pool and receive slots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Register<'a> {
    /// `encoder`, `denoiser`, `decoder`, ...
    pub role: JsonStr<'a>,
    /// The data-plane session peers address this instance's pool by.
    pub session_id: JsonStr<'a>,
    /// Base address of the registered pool in the instance's address space.
    pub pool_ptr: u64,
    /// Size of the pool in bytes.
    pub pool_size: u64,
    /// The instance's own work endpoint (e.g. `tcp://host:port`).
    pub work_endpoint: JsonStr<'a>,
    /// Receive slots the instance set aside in advance.
    pub preallocated_slots: SlotList<'a>,
    /// ferry's addition: how long after it is posted a write of this
    /// instance's may still land, in milliseconds (its data plane's write
    /// lifetime). ferry's coordinator keeps a preallocated slot a failed
    /// write may still land in out of use for at least this long. Written
    /// only when non-zero, and only to ferry's coordinator.
    pub write_lifetime_ms: u64,
}

/// `transfer_register_ack`: the coordinator's answer to a registration.
///
/// The seed names this type but gives it no fields. ferry's choice: the
/// registration it answers (`session_id`, `role`), whether it was accepted,
/// and why not. All fields are always written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegisterAck<'a> {
    /// The session of the registration being answered.
    pub session_id: JsonStr<'a>,
    /// The role it registered as.
    pub role: JsonStr<'a>,
    /// False if the coordinator refused the registration.
    pub accepted: bool,
    /// Why it was refused.
    pub error: Option<JsonStr<'a>>,
}

impl Default for RegisterAck<'_> {
    fn default() -> Self {
        Self {
            session_id: JsonStr::EMPTY,
            role: JsonStr::EMPTY,
            accepted: true,
            error: None,
        }
    }
}

/// `transfer_staged`: a sender has copied a request's tensors into a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Staged<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// Bytes to transfer (the slot's payload, padding included).
    pub data_size: u64,
    /// Where each tensor lies in the slot.
    pub manifest: Manifest<'a>,
    /// The sender's data-plane session.
    pub session_id: JsonStr<'a>,
    /// The sender's pool base address.
    pub pool_ptr: u64,
    /// Offset of the staged slot in the sender's pool.
    pub slot_offset: u64,
    /// *Extension*: scalar fields to relay into `transfer_ready` (default `{}`).
    pub scalar_fields: RawJson<'a>,
}

/// `transfer_alloc`: the coordinator asks a receiver for a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Alloc<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// Bytes the slot must hold.
    pub data_size: u64,
    /// Role of the sender.
    pub source_role: JsonStr<'a>,
    /// *Extension*: the receiver session this request is for (default
    /// `""`), so that a restarted instance on the same endpoint does not
    /// answer for its predecessor.
    pub receiver_session_id: JsonStr<'a>,
}

/// `transfer_allocated`: a receiver reserved a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Allocated<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// The receiver's data-plane session.
    pub session_id: JsonStr<'a>,
    /// The receiver's pool base address.
    pub pool_ptr: u64,
    /// Offset of the reserved slot in the receiver's pool.
    pub slot_offset: u64,
    /// Size of the reserved slot.
    pub slot_size: u64,
}

/// `transfer_alloc_reject` (ferry extension): a receiver cannot allocate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocReject<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// The rejecting receiver's session.
    pub session_id: JsonStr<'a>,
    /// True if asking again later may succeed (pool full, not too small).
    pub retryable: bool,
    /// Why.
    pub reason: JsonStr<'a>,
}

impl Default for AllocReject<'_> {
    fn default() -> Self {
        Self {
            request_id: JsonStr::EMPTY,
            session_id: JsonStr::EMPTY,
            retryable: true,
            reason: JsonStr::EMPTY,
        }
    }
}

/// `transfer_push`: the coordinator tells a sender where to write.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Push<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// The receiver's data-plane session.
    pub dest_session_id: JsonStr<'a>,
    /// Destination address in the receiver's address space.
    pub dest_addr: u64,
    /// Bytes to write.
    pub transfer_size: u64,
}

/// `transfer_pushed`: a sender finished (or failed) its write.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pushed<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// *Extension*: false if the write failed (default true).
    pub success: bool,
    /// *Extension*: what failed (default `None`).
    pub error: Option<JsonStr<'a>>,
}

impl Default for Pushed<'_> {
    fn default() -> Self {
        Self {
            request_id: JsonStr::EMPTY,
            success: true,
            error: None,
        }
    }
}

/// `transfer_ready`: the bytes are in the receiver's slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ready<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// Where each tensor lies in the slot.
    pub manifest: Manifest<'a>,
    /// Offset of the slot in the receiver's pool.
    pub slot_offset: u64,
    /// Scalar fields relayed from the sender.
    pub scalar_fields: RawJson<'a>,
    /// *Extension*: the receiver session the data was written to (default
    /// `""`): a restarted instance on the same endpoint must not take its
    /// predecessor's transfer for its own.
    pub dest_session_id: JsonStr<'a>,
    /// The preallocated slot the fast path chose, written as sglang's head
    /// writes it: as `_prealloc_slot_id`, the last key *inside*
    /// `scalar_fields` (sglang's receiver pops it to find the slot). Only
    /// an encoder setting; decoding leaves the key in `scalar_fields` and
    /// this `None`.
    pub prealloc_slot_id: Option<u64>,
}

/// `transfer_done`: the receiver consumed (or failed) the request.
///
/// With `staged_for_decoder` it is also sglang's forward (what its
/// denoiser sends): the receiver is done with its slot *and* has staged
/// the request's next leg in its own pool, described by the remaining
/// fields as in `transfer_staged`. Written, in sglang's order
/// (`request_id`, `staged_for_decoder`, `session_id`, `pool_ptr`,
/// `slot_offset`, `data_size`, `manifest`, `scalar_fields`), only when
/// `staged_for_decoder` is true; otherwise the seed's two fields.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Done<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// Why it failed, if it did.
    pub error: Option<JsonStr<'a>>,
    /// *sglang 0.5.23*: the next leg is staged (the fields below say where).
    pub staged_for_decoder: bool,
    /// *sglang 0.5.23*: the forwarding sender's data-plane session.
    pub session_id: JsonStr<'a>,
    /// *sglang 0.5.23*: the forwarding sender's pool base address.
    pub pool_ptr: u64,
    /// *sglang 0.5.23*: offset of the staged slot in that pool.
    pub slot_offset: u64,
    /// *sglang 0.5.23*: bytes to transfer.
    pub data_size: u64,
    /// *sglang 0.5.23*: where each tensor lies in the staged slot.
    pub manifest: Manifest<'a>,
    /// *sglang 0.5.23*: scalar fields to relay into the next `transfer_ready`.
    pub scalar_fields: RawJson<'a>,
}

impl<'a> Done<'a> {
    /// The forward that ends a receive and stages `next` (the same
    /// request's next leg), as sglang's denoiser sends it.
    pub fn forward(next: Staged<'a>) -> Self {
        Self {
            request_id: next.request_id,
            error: None,
            staged_for_decoder: true,
            session_id: next.session_id,
            pool_ptr: next.pool_ptr,
            slot_offset: next.slot_offset,
            data_size: next.data_size,
            manifest: next.manifest,
            scalar_fields: next.scalar_fields,
        }
    }

    /// The forward's next leg as the `transfer_staged` it stands for, if
    /// this is a forward.
    pub fn staged(&self) -> Option<Staged<'a>> {
        self.staged_for_decoder.then_some(Staged {
            request_id: self.request_id,
            data_size: self.data_size,
            manifest: self.manifest,
            session_id: self.session_id,
            pool_ptr: self.pool_ptr,
            slot_offset: self.slot_offset,
            scalar_fields: self.scalar_fields,
        })
    }
}

/// `transfer_abort` (ferry extension): the coordinator gave up on a request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Abort<'a> {
    /// The request.
    pub request_id: JsonStr<'a>,
    /// Why (timeout, peer gone, write failed, ...).
    pub reason: JsonStr<'a>,
    /// The role of the leg's sender: the same request id passes through
    /// every leg of the pipeline, so an instance that both received and
    /// forwards a request learns which of its two sides is aborted.
    /// Written only when non-empty.
    pub source_role: JsonStr<'a>,
}

/// `transfer_deregister` (ferry extension): an instance leaves.
///
/// Instance → coordinator: with `draining`, it takes no new work (the
/// coordinator stops choosing it as a receiver and uses none of its
/// preallocated slots) and finishes what it holds; without, it is gone,
/// and every transfer still needing it fails, its peers told with
/// `transfer_abort`. Coordinator → a draining instance, `draining` false:
/// nothing is addressed to it any more (its drain may end). All fields are
/// always written.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Deregister<'a> {
    /// The leaving instance's session.
    pub session_id: JsonStr<'a>,
    /// True: it drains (finishes what it holds, takes nothing new); false:
    /// it is gone.
    pub draining: bool,
    /// Why, for people (the coordinator reports it with the event; the
    /// aborts say "instance left").
    pub reason: JsonStr<'a>,
}

/// A decoded (or to-be-encoded) transfer message.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Msg<'a> {
    Register(Register<'a>),
    RegisterAck(RegisterAck<'a>),
    Staged(Staged<'a>),
    Alloc(Alloc<'a>),
    Allocated(Allocated<'a>),
    AllocReject(AllocReject<'a>),
    Push(Push<'a>),
    Pushed(Pushed<'a>),
    Ready(Ready<'a>),
    Done(Done<'a>),
    Abort(Abort<'a>),
    Deregister(Deregister<'a>),
}

impl<'a> Msg<'a> {
    /// The message's type.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Self::Register(_) => MsgType::Register,
            Self::RegisterAck(_) => MsgType::RegisterAck,
            Self::Staged(_) => MsgType::Staged,
            Self::Alloc(_) => MsgType::Alloc,
            Self::Allocated(_) => MsgType::Allocated,
            Self::AllocReject(_) => MsgType::AllocReject,
            Self::Push(_) => MsgType::Push,
            Self::Pushed(_) => MsgType::Pushed,
            Self::Ready(_) => MsgType::Ready,
            Self::Done(_) => MsgType::Done,
            Self::Abort(_) => MsgType::Abort,
            Self::Deregister(_) => MsgType::Deregister,
        }
    }

    /// The request the message is about; `None` for registration messages.
    pub fn request_id(&self) -> Option<JsonStr<'a>> {
        match self {
            Self::Register(_) | Self::RegisterAck(_) | Self::Deregister(_) => None,
            Self::Staged(m) => Some(m.request_id),
            Self::Alloc(m) => Some(m.request_id),
            Self::Allocated(m) => Some(m.request_id),
            Self::AllocReject(m) => Some(m.request_id),
            Self::Push(m) => Some(m.request_id),
            Self::Pushed(m) => Some(m.request_id),
            Self::Ready(m) => Some(m.request_id),
            Self::Done(m) => Some(m.request_id),
            Self::Abort(m) => Some(m.request_id),
        }
    }
}

impl Default for RawJson<'_> {
    /// The empty object, the default of every raw field in the protocol
    /// except `preallocated_slots`.
    fn default() -> Self {
        RawJson::EMPTY_OBJECT
    }
}
