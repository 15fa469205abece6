//! Where a request's tensors go in its slot: each starts on a 512-byte
//! boundary, and the slot size counts the padding.

use core::fmt;

use super::dtype::Dtype;
use crate::json::JsonStr;
use crate::wire::{DecodeError, Manifest, Shape, TensorEntry};

/// Every tensor starts at a multiple of this many bytes from the slot start.
pub const TENSOR_ALIGN: u64 = 512;

/// One tensor to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorSpec<'a> {
    /// The request field it belongs to.
    pub field: &'a str,
    /// Position in the field's list, for list-valued fields.
    pub list_index: Option<u64>,
    /// Dimensions.
    pub shape: &'a [u64],
    /// Element type.
    pub dtype: Dtype,
    /// Bytes of tensor data; must equal the shape's elements times the
    /// element size (the tensor is contiguous).
    pub byte_len: u64,
}

/// The result of a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Entries written.
    pub tensors: usize,
    /// Bytes the slot needs: the end of the last tensor, rounded up to
    /// [`TENSOR_ALIGN`]; alignment padding included.
    pub data_size: u64,
}

/// Why tensors could not be laid out, or a manifest does not fit its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The output holds fewer entries than there are tensors.
    OutputTooSmall {
        /// Entries needed.
        needed: usize,
    },
    /// A tensor's byte length is not its shape times its element size.
    ByteLenMismatch {
        /// Which tensor.
        index: usize,
        /// Shape × element size.
        expected: u64,
        /// The byte length given.
        byte_len: u64,
    },
    /// Sizes or offsets overflow 64 bits.
    Overflow {
        /// Which tensor.
        index: usize,
    },
    /// A manifest entry is malformed.
    Entry {
        /// Which entry.
        index: usize,
        /// What is wrong with it.
        error: DecodeError,
    },
    /// A manifest entry names a dtype ferry does not know.
    UnknownDtype {
        /// Which entry.
        index: usize,
    },
    /// A manifest entry's offset is not a multiple of [`TENSOR_ALIGN`].
    Misaligned {
        /// Which entry.
        index: usize,
        /// Its offset.
        offset: u64,
    },
    /// A manifest entry reaches past the end of the slot.
    OutOfSlot {
        /// Which entry.
        index: usize,
        /// Where the tensor ends.
        end: u64,
        /// The slot's size.
        slot_size: u64,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::OutputTooSmall { needed } => {
                write!(f, "room for {needed} manifest entries needed")
            }
            Self::ByteLenMismatch {
                index,
                expected,
                byte_len,
            } => write!(
                f,
                "tensor {index}: {byte_len} bytes given, shape and dtype make {expected}"
            ),
            Self::Overflow { index } => {
                write!(f, "tensor {index}: size or offset overflows 64 bits")
            }
            Self::Entry { index, error } => write!(f, "manifest entry {index}: {error}"),
            Self::UnknownDtype { index } => write!(f, "manifest entry {index}: unknown dtype"),
            Self::Misaligned { index, offset } => write!(
                f,
                "manifest entry {index}: offset {offset} is not a multiple of {TENSOR_ALIGN}"
            ),
            Self::OutOfSlot {
                index,
                end,
                slot_size,
            } => write!(
                f,
                "manifest entry {index}: ends at byte {end}, past the {slot_size}-byte slot"
            ),
        }
    }
}

impl core::error::Error for LayoutError {}

/// Bytes of a tensor of `shape` and `dtype`, or `None` on overflow.
fn tensor_bytes(shape: impl IntoIterator<Item = u64>, dtype: Dtype) -> Option<u64> {
    shape
        .into_iter()
        .try_fold(dtype.size(), |acc, d| acc.checked_mul(d))
}

fn align_up(v: u64) -> Option<u64> {
    v.checked_next_multiple_of(TENSOR_ALIGN)
}

/// Places `tensors` one after another at 512-byte boundaries, in order, and
/// writes their manifest entries into `out`; the manifest to send is
/// `Manifest::Entries(&out[..layout.tensors])`. Nothing is written on error.
pub fn layout<'a>(
    tensors: &[TensorSpec<'a>],
    out: &mut [TensorEntry<'a>],
) -> Result<Layout, LayoutError> {
    if out.len() < tensors.len() {
        return Err(LayoutError::OutputTooSmall {
            needed: tensors.len(),
        });
    }
    // Check everything first, so that a failure leaves `out` untouched.
    let mut end = 0u64;
    for (index, t) in tensors.iter().enumerate() {
        let expected = tensor_bytes(t.shape.iter().copied(), t.dtype)
            .ok_or(LayoutError::Overflow { index })?;
        if expected != t.byte_len {
            return Err(LayoutError::ByteLenMismatch {
                index,
                expected,
                byte_len: t.byte_len,
            });
        }
        end = align_up(end)
            .and_then(|offset| offset.checked_add(t.byte_len))
            .ok_or(LayoutError::Overflow { index })?;
    }
    let data_size = align_up(end).ok_or(LayoutError::Overflow {
        index: tensors.len().saturating_sub(1),
    })?;
    let mut offset = 0u64;
    for (t, slot) in tensors.iter().zip(out.iter_mut()) {
        // Checked above: none of this can overflow.
        offset = offset.next_multiple_of(TENSOR_ALIGN);
        *slot = TensorEntry {
            field: JsonStr::plain(t.field),
            list_index: t.list_index,
            offset,
            shape: Shape::Dims(t.shape),
            dtype: JsonStr::plain(t.dtype.name()),
        };
        offset += t.byte_len;
    }
    Ok(Layout {
        tensors: tensors.len(),
        data_size,
    })
}

/// What [`check_manifest`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestExtent {
    /// Tensors in the manifest.
    pub tensors: usize,
    /// The end of the last byte any tensor uses.
    pub end: u64,
}

/// The receiver's check before it hands tensors to the application: every
/// entry is well formed, names a known dtype, starts on a 512-byte boundary
/// and lies inside a slot of `slot_size` bytes.
pub fn check_manifest(
    manifest: &Manifest<'_>,
    slot_size: u64,
) -> Result<ManifestExtent, LayoutError> {
    let mut tensors = 0;
    let mut end = 0u64;
    for (index, entry) in manifest.iter().enumerate() {
        let e = entry.map_err(|error| LayoutError::Entry { index, error })?;
        let mut name = [0u8; 32];
        let dtype = e
            .dtype
            .unescape_into(&mut name)
            .ok()
            .and_then(|n| Dtype::from_name(n).ok())
            .ok_or(LayoutError::UnknownDtype { index })?;
        if e.offset % TENSOR_ALIGN != 0 {
            return Err(LayoutError::Misaligned {
                index,
                offset: e.offset,
            });
        }
        let tensor_end = tensor_bytes(e.shape.dims(), dtype)
            .and_then(|n| n.checked_add(e.offset))
            .ok_or(LayoutError::Overflow { index })?;
        if tensor_end > slot_size {
            return Err(LayoutError::OutOfSlot {
                index,
                end: tensor_end,
                slot_size,
            });
        }
        end = end.max(tensor_end);
        tensors += 1;
    }
    Ok(ManifestExtent { tensors, end })
}

/// The bytes of one manifest entry, or `None` for an unknown dtype or an
/// overflow.
pub fn entry_bytes(entry: &TensorEntry<'_>) -> Option<u64> {
    let mut name = [0u8; 32];
    let dtype = Dtype::from_name(entry.dtype.unescape_into(&mut name).ok()?).ok()?;
    tensor_bytes(entry.shape.dims(), dtype)
}
