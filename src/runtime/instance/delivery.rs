//! A received transfer the application holds: typed views of its tensors
//! over the slot, released (or failed) when done.

use super::*;

/// One tensor of a delivery.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'d> {
    /// The request field it belongs to.
    pub field: JsonStr<'d>,
    /// Position in the field's list, for list-valued fields.
    pub list_index: Option<u64>,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Shape<'d>,
    /// The tensor's bytes in the slot.
    pub bytes: &'d [u8],
}

impl TensorView<'_> {
    /// The dimensions.
    pub fn dims(&self) -> ShapeIter<'_> {
        self.shape.dims()
    }
}

/// A received transfer the application holds; its slot is freed (and
/// `transfer_done` sent) on [`release`](Self::release), [`fail`](Self::fail)
/// or drop.
pub struct Delivery<'n> {
    pub(super) node: &'n InstanceNode,
    pub(super) token: Option<Token>,
    pub(super) arrived: Arrival,
    pub(super) meta: Vec<u8>,
    pub(super) id_len: usize,
    pub(super) manifest_len: usize,
    pub(super) slot_offset: u64,
    pub(super) slot_size: u64,
}

impl Delivery<'_> {
    fn text(&self, start: usize, len: usize) -> &str {
        // Copied from validated JSON text and an id held as a str.
        std::str::from_utf8(&self.meta[start..start + len]).unwrap_or("")
    }

    /// When the transfer reached this node (its `transfer_ready` was
    /// accepted), on the wall clock so that it compares across processes.
    pub fn arrived(&self) -> SystemTime {
        self.arrived.wall
    }

    /// The request id.
    pub fn id(&self) -> &str {
        self.text(0, self.id_len)
    }

    /// The manifest as received (checked against the slot).
    pub fn manifest(&self) -> Manifest<'_> {
        let raw = RawJson::parse_object(self.text(self.id_len, self.manifest_len))
            .unwrap_or(RawJson::EMPTY_OBJECT);
        Manifest::Raw(raw)
    }

    /// The scalar fields relayed from the sender (a JSON object).
    pub fn scalar_fields(&self) -> &str {
        let start = self.id_len + self.manifest_len;
        self.text(start, self.meta.len() - start)
    }

    /// The whole slot.
    pub fn slot(&self) -> &[u8] {
        self.node
            .shared
            .memory
            .delivered(self.slot_offset, self.slot_size)
            .unwrap_or(&[])
    }

    /// The tensors, in manifest order. Every entry was checked to lie in
    /// the slot before the transfer was delivered.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        let slot = self.slot();
        let manifest = self.manifest();
        manifest.iter().filter_map(move |e| {
            let e = e.ok()?;
            let len = tensorferry_core::slots::entry_bytes(&e)?;
            let mut name = [0u8; 32];
            let dtype = Dtype::from_name(e.dtype.unescape_into(&mut name).ok()?).ok()?;
            let start = usize::try_from(e.offset).ok()?;
            let bytes = slot.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
            Some(TensorView {
                field: e.field,
                list_index: e.list_index,
                dtype,
                shape: e.shape,
                bytes,
            })
        })
    }

    /// True if the coordinator aborted the request since it arrived
    /// (it timed out, or the coordinator was lost): its result is not
    /// wanted. Release it all the same.
    pub fn is_aborted(&self) -> bool {
        let Some(token) = self.token else {
            return false;
        };
        let st = self.node.shared.lock();
        st.machine.received(token).is_some_and(|rx| rx.aborted)
    }

    /// Done with it: the slot is freed and the coordinator told.
    pub fn release(mut self) {
        self.finish(None);
    }

    /// Done with it, but it could not be used: `reason` goes to the
    /// coordinator in `transfer_done.error` (cut at
    /// [`REASON_LEN`](tensorferry_core::handshake::REASON_LEN) bytes).
    pub fn fail(mut self, reason: &str) {
        self.finish(Some(reason));
    }

    fn finish(&mut self, error: Option<&str>) {
        if let Some(token) = self.token.take() {
            let meta = std::mem::take(&mut self.meta);
            self.node.release(token, error, meta, self.arrived);
        }
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        self.finish(None);
    }
}
