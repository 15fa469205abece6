//! Each message type's fields in the order the seed's encoder writes them
//! (the order the decoder predicts), and the assignment of a field from
//! the value at a position, read by its type's reader.
//!
//! Each message is filled as its own struct, not through [`Msg`], so that
//! a field's assignment is one store and the finished message is built in
//! place rather than copied out of an enum.

use super::read::{arr_at, bool_at, obj_at, opt_str_at, str_at, u64_at};
use crate::wire::manifest::Manifest;
use crate::wire::msg::*;
use crate::wire::slots::SlotList;

/// One field of a message type.
pub(super) struct Field {
    /// `"name":`, as the seed writes the key: what is compared when the
    /// field is the one expected next.
    pub pat: &'static [u8],
    /// The key's name, for a key that came out of order.
    pub name: &'static str,
}

/// A message struct the fast path fills field by field.
pub(super) trait Fill<'a>: Default {
    /// The fields, in the seed's order.
    const FIELDS: &'static [Field];

    /// Reads the value at `p` into field `i` of [`FIELDS`](Self::FIELDS)
    /// with the reader for its type; the position after the value, or
    /// `None` if the value is not of that type.
    fn set(&mut self, i: usize, text: &'a str, p: usize) -> Option<usize>;
}

/// Implements [`Fill`] for a message struct from its fields in wire order:
/// `"key" => field: reader` (and `as wrap` for a reader's value that the
/// field holds wrapped).
macro_rules! fill {
    ($ty:ident { $($name:literal => $field:ident: $read:ident $(as $wrap:path)?),* $(,)? }) => {
        impl<'a> Fill<'a> for $ty<'a> {
            const FIELDS: &'static [Field] = &[$(Field {
                pat: concat!("\"", $name, "\":").as_bytes(),
                name: $name,
            }),*];

            #[inline(always)]
            fn set(&mut self, i: usize, text: &'a str, p: usize) -> Option<usize> {
                let mut k = 0;
                $(
                    if i == k {
                        let (v, end) = $read(text, p)?;
                        self.$field = $($wrap)?(v);
                        return Some(end);
                    }
                    k += 1;
                )*
                let _ = k;
                None
            }
        }
    };
}

fill!(Register {
    "role" => role: str_at,
    "session_id" => session_id: str_at,
    "pool_ptr" => pool_ptr: u64_at,
    "pool_size" => pool_size: u64_at,
    "work_endpoint" => work_endpoint: str_at,
    "preallocated_slots" => preallocated_slots: arr_at as SlotList::Raw,
    "write_lifetime_ms" => write_lifetime_ms: u64_at,
});

fill!(RegisterAck {
    "session_id" => session_id: str_at,
    "role" => role: str_at,
    "accepted" => accepted: bool_at,
    "error" => error: opt_str_at,
});

fill!(Staged {
    "request_id" => request_id: str_at,
    "data_size" => data_size: u64_at,
    "manifest" => manifest: obj_at as Manifest::Raw,
    "session_id" => session_id: str_at,
    "pool_ptr" => pool_ptr: u64_at,
    "slot_offset" => slot_offset: u64_at,
    "scalar_fields" => scalar_fields: obj_at,
});

fill!(Alloc {
    "request_id" => request_id: str_at,
    "data_size" => data_size: u64_at,
    "source_role" => source_role: str_at,
    "receiver_session_id" => receiver_session_id: str_at,
});

fill!(Allocated {
    "request_id" => request_id: str_at,
    "session_id" => session_id: str_at,
    "pool_ptr" => pool_ptr: u64_at,
    "slot_offset" => slot_offset: u64_at,
    "slot_size" => slot_size: u64_at,
});

fill!(AllocReject {
    "request_id" => request_id: str_at,
    "session_id" => session_id: str_at,
    "retryable" => retryable: bool_at,
    "reason" => reason: str_at,
});

fill!(Push {
    "request_id" => request_id: str_at,
    "dest_session_id" => dest_session_id: str_at,
    "dest_addr" => dest_addr: u64_at,
    "transfer_size" => transfer_size: u64_at,
});

fill!(Pushed {
    "request_id" => request_id: str_at,
    "success" => success: bool_at,
    "error" => error: opt_str_at,
});

fill!(Ready {
    "request_id" => request_id: str_at,
    "manifest" => manifest: obj_at as Manifest::Raw,
    "slot_offset" => slot_offset: u64_at,
    "scalar_fields" => scalar_fields: obj_at,
    "dest_session_id" => dest_session_id: str_at,
});

// sglang's forward order; a plain done is its first two.
fill!(Done {
    "request_id" => request_id: str_at,
    "error" => error: opt_str_at,
    "staged_for_decoder" => staged_for_decoder: bool_at,
    "session_id" => session_id: str_at,
    "pool_ptr" => pool_ptr: u64_at,
    "slot_offset" => slot_offset: u64_at,
    "data_size" => data_size: u64_at,
    "manifest" => manifest: obj_at as Manifest::Raw,
    "scalar_fields" => scalar_fields: obj_at,
});

fill!(Abort {
    "request_id" => request_id: str_at,
    "reason" => reason: str_at,
    "source_role" => source_role: str_at,
});

fill!(Deregister {
    "session_id" => session_id: str_at,
    "draining" => draining: bool_at,
    "reason" => reason: str_at,
});
