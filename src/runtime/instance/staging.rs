//! A request being staged: its slot, filled in place, then committed or
//! forwarded.

use super::*;

pub(super) const EMPTY_ENTRY: TensorEntry<'static> = TensorEntry {
    field: JsonStr::plain(""),
    list_index: None,
    offset: 0,
    shape: Shape::Dims(&[]),
    dtype: JsonStr::plain(""),
};

/// A request being staged: its slot, to fill before committing.
pub struct Staging<'n, 'a> {
    pub(super) node: &'n InstanceNode,
    pub(super) token: Option<Token>,
    pub(super) offset: u64,
    pub(super) data_size: u64,
    pub(super) entries: [TensorEntry<'a>; MAX_TENSORS],
    pub(super) count: usize,
}

impl Staging<'_, '_> {
    /// Bytes the slot's data takes (alignment padding included).
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// The bytes of tensor `i`, in the order given to `stage`.
    pub fn tensor_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let e = self.entries[..self.count].get(i)?;
        let len = tensorferry_core::slots::entry_bytes(e)?;
        self.node
            .shared
            .memory
            .staged_mut(self.offset + e.offset, len)
    }

    /// Announces the filled slot to the coordinator, with `scalar_fields`
    /// (a JSON object) relayed to the receiver.
    pub fn commit(mut self, scalar_fields: &str) -> Result<(), NodeError> {
        let scalars = RawJson::parse_object(scalar_fields).map_err(NodeError::ScalarFields)?;
        let Some(token) = self.token else {
            return Ok(());
        };
        let shared = &self.node.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        let manifest = Manifest::Entries(&self.entries[..self.count]);
        st.machine
            .commit(now, token, self.data_size, &manifest, scalars)?;
        self.token = None;
        Metrics::add(&shared.probe.metrics.staged, 1);
        shared.drive_and_send(st, now);
        Ok(())
    }
}

impl Staging<'_, '_> {
    /// Announces the filled slot as the next leg of `delivery` (the same
    /// request, received by this node) and releases the delivery, at once:
    /// under sglang's head in its one message,
    /// `transfer_done{staged_for_decoder}`, which that head needs from a
    /// denoiser; under ferry's coordinator as `transfer_staged` then
    /// `transfer_done`.
    ///
    /// On an error the delivery is failed with its text (its slot freed,
    /// the coordinator told) and the staged slot given back.
    pub fn forward(mut self, delivery: Delivery<'_>, scalar_fields: &str) -> Result<(), NodeError> {
        let mut delivery = delivery;
        let result = self.forward_inner(&mut delivery, scalar_fields);
        if let Err(e) = &result {
            delivery.fail(&e.to_string());
        }
        result
    }

    fn forward_inner(
        &mut self,
        delivery: &mut Delivery<'_>,
        scalar_fields: &str,
    ) -> Result<(), NodeError> {
        if !std::ptr::eq(self.node, delivery.node) {
            // Its token would name a request of another machine.
            return Err(NodeError::ForeignDelivery);
        }
        let scalars = RawJson::parse_object(scalar_fields).map_err(NodeError::ScalarFields)?;
        let (Some(token), Some(received)) = (self.token, delivery.token) else {
            return Err(NodeError::Instance(
                tensorferry_core::handshake::instance::InstanceError::StaleToken,
            ));
        };
        let shared = &self.node.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        let manifest = Manifest::Entries(&self.entries[..self.count]);
        st.machine
            .forward(now, received, token, self.data_size, &manifest, scalars)?;
        self.token = None;
        delivery.token = None;
        st.meta_free.push(std::mem::take(&mut delivery.meta));
        shared.probe.hold.observe(delivery.arrived.at.elapsed());
        Metrics::add(&shared.probe.metrics.staged, 1);
        Metrics::add(&shared.probe.metrics.released, 1);
        shared.drive_and_send(st, now);
        Ok(())
    }
}

impl Drop for Staging<'_, '_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let _ = self.node.shared.lock().machine.unstage(token);
        }
    }
}
