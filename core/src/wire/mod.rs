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
//!
//! ```
//! use tensorferry_core::wire::{decode, transfer_payload, Msg};
//!
//! let frames: [&[u8]; 2] = [
//!     b"__transfer__",
//!     br#"{ "request_id": "r1", "msg_type": "transfer_push", "dest_addr": 4096, "x": NaN }"#,
//! ];
//! let payload = transfer_payload(&frames).expect("a transfer frame");
//! let msg = decode(payload)?;
//! let Msg::Push(push) = msg else { panic!("not a push") };
//! assert_eq!((push.request_id, push.dest_addr), ("r1".into(), 4096));
//!
//! // The seed's bytes: field order, defaults filled in, unknown keys gone.
//! let mut buf = [0u8; 256];
//! let n = msg.encode(&mut buf)?;
//! assert_eq!(
//!     &buf[..n],
//!     br#"{"msg_type":"transfer_push","request_id":"r1","dest_session_id":"","dest_addr":4096,"transfer_size":0}"#
//! );
//! // Too small a buffer says how much is needed.
//! assert_eq!(msg.encode(&mut buf[..10]).unwrap_err().needed, n);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// `PartialEq` for a list that is either typed or raw JSON: two are equal
/// when their items are, so a list as received equals the typed one it
/// spells. A macro because the impl is the same for each such type and the
/// orphan rule allows no blanket impl of `PartialEq` over a trait of ours.
macro_rules! eq_by_items {
    ($ty:ty) => {
        impl PartialEq for $ty {
            fn eq(&self, other: &Self) -> bool {
                self.iter().eq(other.iter())
            }
        }
    };
}

mod decode;
mod encode;
mod error;
mod fast;
mod frame;
mod manifest;
mod msg;
mod result;
mod slots;
mod value;

pub use decode::{decode, decode_reference};
pub use encode::{Dialect, Style};
pub use error::{DecodeError, DecodeErrorKind};
pub use frame::{is_transfer_frame, transfer_payload, TRANSFER_MAGIC};
pub use manifest::{Manifest, ManifestIter, Shape, ShapeIter, TensorEntry};
pub use msg::{
    Abort, Alloc, AllocReject, Allocated, Deregister, Done, Msg, MsgType, Push, Pushed, Ready,
    Register, RegisterAck, Staged,
};
pub use result::result_as_done;
pub use slots::{PreallocatedSlot, SlotList, SlotListIter};

pub use crate::json::{BufferTooSmall, JsonStr, RawJson};
