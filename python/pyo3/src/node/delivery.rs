//! `Delivery`: a transfer received into an instance's pool (see
//! `tensorferry.Delivery`).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensorferry::runtime::Delivery;

use super::{named, Node, Slot};
use crate::buffer::{SlotBuffer, Span};

pub(super) struct TensorInfo {
    pub(super) field: String,
    pub(super) list_index: Option<u64>,
    pub(super) dtype: &'static str,
    pub(super) shape: Vec<u64>,
    pub(super) span: Span,
}

pub(super) struct DeliveryInner {
    // Dropped first: it borrows the node.
    pub(super) delivery: Delivery<'static>,
    pub(super) _node: Arc<Node>,
}

impl DeliveryInner {
    /// Releases the delivery, or fails it with `error` (see the note on
    /// `StagingInner`).
    fn finish(self, error: Option<&str>) {
        let Self { delivery, _node } = self;
        match error {
            Some(reason) => delivery.fail(reason),
            None => delivery.release(),
        }
    }
}

/// A received transfer (see `tensorferry.Delivery`).
#[pyclass(name = "Delivery", module = "tensorferry._native", frozen)]
pub struct PyDelivery {
    pub(super) slot: Slot<DeliveryInner>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) scalar_fields: String,
    pub(super) manifest: String,
}

#[pymethods]
impl PyDelivery {
    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        &self.slot.request_id
    }

    /// The sender's scalar fields (JSON object text).
    #[getter]
    fn scalar_fields(&self) -> &str {
        &self.scalar_fields
    }

    /// The manifest as received (JSON object text).
    #[getter]
    fn manifest(&self) -> &str {
        &self.manifest
    }

    /// The tensors, in manifest order: `tensorferry.TensorSpec`'s fields,
    /// as `InstanceNode.stage` takes them.
    fn specs(&self) -> Vec<named::TensorSpec> {
        self.tensors
            .iter()
            .map(|t| named::TensorSpec {
                field: t.field.clone(),
                index: t.list_index,
                shape: t.shape.clone(),
                dtype: t.dtype.to_owned(),
            })
            .collect()
    }

    /// The read-only bytes of tensor `i`.
    fn buffer(slf: &Bound<'_, Self>, i: usize) -> PyResult<SlotBuffer> {
        let me = slf.get();
        let t = me
            .tensors
            .get(i)
            .ok_or_else(|| PyValueError::new_err(format!("no tensor {i}")))?;
        Ok(SlotBuffer::new(
            t.span,
            true,
            Arc::clone(&me.slot.exports),
            slf.clone().into_any().unbind(),
        ))
    }

    /// True if the coordinator aborted the request since it arrived.
    #[getter]
    fn is_aborted(&self) -> bool {
        self.slot
            .lock()
            .as_ref()
            .is_some_and(|i| i.delivery.is_aborted())
    }

    /// Frees the slot and tells the coordinator (`error`: it could not be
    /// used, and why).
    #[pyo3(signature = (error = None))]
    fn release(&self, py: Python<'_>, error: Option<&str>) -> PyResult<()> {
        let inner = self.slot.take(py, "release")?;
        py.detach(|| inner.finish(error));
        Ok(())
    }

    /// True until released.
    #[getter]
    fn held(&self) -> bool {
        self.slot.held()
    }
}
