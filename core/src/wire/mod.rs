//! The transfer protocol's control messages and their JSON codec.
//!
//! Decoding borrows from the frame ([`Msg<'a>`](Msg)): strings stay escaped
//! until asked for, `manifest`, `scalar_fields` and `preallocated_slots` stay
//! raw (validated) JSON with typed iterators over them, and nothing is
//! allocated, whatever the size of the message.
//!
//! Encoding writes into a caller buffer. The bytes are exactly those of the
//! seed's `encode_transfer_msg` (`json.dumps(asdict(msg),
//! separators=(",", ":"))`) for the same values; ferry's compatible
//! extension fields are written only when they differ from their defaults.

mod decode;
mod encode;
mod error;
mod frame;
mod manifest;
mod msg;
mod slots;
mod value;

pub use decode::decode;
pub use encode::Style;
pub use error::{DecodeError, DecodeErrorKind};
pub use frame::{is_transfer_frame, transfer_payload, TRANSFER_MAGIC};
pub use manifest::{Manifest, ManifestIter, Shape, ShapeIter, TensorEntry};
pub use msg::{
    Abort, Alloc, AllocReject, Allocated, Done, Msg, MsgType, Push, Pushed, Ready, Register,
    RegisterAck, Staged,
};
pub use slots::{PreallocatedSlot, SlotList, SlotListIter};

pub use crate::json::{BufferTooSmall, JsonStr, RawJson};
