//! The one seam where the runtime touches registered pool memory: views of
//! slots as byte slices, over a pool whose owner the node keeps (a
//! [`PoolOwner`](tensorferry_core::transport::PoolOwner)).
#![allow(unsafe_code)]

/// A registered pool as this process maps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolMemory {
    base: usize,
    len: usize,
}

impl PoolMemory {
    /// A view of the pool at `base`.
    ///
    /// # Safety
    /// `base..base + len` must stay mapped, readable and writable for as
    /// long as this value or any slice made from it is used.
    pub(crate) unsafe fn new(base: *mut u8, len: usize) -> Self {
        Self {
            base: base as usize,
            len,
        }
    }

    /// The pool's first byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base as *mut u8
    }

    /// The pool's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn range(&self, offset: u64, len: u64) -> Option<(usize, usize)> {
        let (offset, len) = (usize::try_from(offset).ok()?, usize::try_from(len).ok()?);
        (offset.checked_add(len)? <= self.len).then_some((self.base + offset, len))
    }

    /// The bytes of a slot this instance staged and is filling.
    ///
    /// Callers pass only a slot in the Filling state: the pool allocator
    /// gave it to this request alone, and no peer is ever told to write
    /// into it (peers write only into slots reserved for receiving).
    pub(crate) fn staged_mut<'a>(&self, offset: u64, len: u64) -> Option<&'a mut [u8]> {
        let (start, len) = self.range(offset, len)?;
        // SAFETY: in bounds of the mapping (checked), which outlives 'a by
        // `new`'s contract (the node that made this view outlives every
        // Staging that borrows it); exclusive as argued above.
        Some(unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) })
    }

    /// The bytes of a slot that holds a received transfer.
    ///
    /// Callers pass only a slot whose transfer was delivered: its writer
    /// reported the write complete before `transfer_ready`, and the slot is
    /// not handed to another writer until the application releases it.
    pub(crate) fn delivered<'a>(&self, offset: u64, len: u64) -> Option<&'a [u8]> {
        let (start, len) = self.range(offset, len)?;
        // SAFETY: in bounds of the live mapping (as above); no one writes
        // the slot while the application holds it, as argued above.
        Some(unsafe { std::slice::from_raw_parts(start as *const u8, len) })
    }
}
