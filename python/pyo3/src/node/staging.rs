//! `Staging`: a slot reserved for a request, to fill and commit (see
//! `tensorferry.Staging`).

use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use tensorferry::runtime::{NodeError, Staging};

use super::delivery::{DeliveryInner, PyDelivery};
use super::{Node, Slot};
use crate::buffer::{SlotBuffer, Span};
use crate::errors::{node_error, raise};
use tensorferry::runtime::ErrorKind;

pub(super) struct StagingInner {
    // Dropped first: it borrows the fields after it.
    pub(super) staging: Staging<'static, 'static>,
    pub(super) _names: Box<[String]>,
    pub(super) _shapes: Box<[Box<[u64]>]>,
    pub(super) _node: Arc<Node>,
}

// The handles are consumed by methods that bind every field by name, so
// that the owners the handle borrows are dropped after the call, at the
// end of the method (a `let S { handle, .. } = temporary` would drop them
// at the end of that statement, before the handle is used).
impl StagingInner {
    /// Consumes the handle with `f`; its owners are dropped once `f`
    /// returned.
    fn consume<R>(self, f: impl FnOnce(Staging<'static, 'static>) -> R) -> R {
        let Self {
            staging,
            _names,
            _shapes,
            _node,
        } = self;
        f(staging)
    }

    fn commit(self, scalar_fields: &str) -> Result<(), NodeError> {
        self.consume(|staging| staging.commit(scalar_fields))
    }

    fn forward(self, received: DeliveryInner, scalar_fields: &str) -> Result<(), NodeError> {
        let DeliveryInner {
            delivery,
            _node: _received_node,
        } = received;
        self.consume(|staging| staging.forward(delivery, scalar_fields))
    }
}

/// A slot reserved for a request, to fill and commit (see `tensorferry.Staging`).
#[pyclass(name = "Staging", module = "tensorferry._native", frozen)]
pub struct PyStaging {
    pub(super) slot: Slot<StagingInner>,
    pub(super) spans: Vec<Span>,
    pub(super) data_size: u64,
}

#[pymethods]
impl PyStaging {
    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        &self.slot.request_id
    }

    /// Bytes the slot's data takes.
    #[getter]
    fn data_size(&self) -> u64 {
        self.data_size
    }

    /// The writable bytes of tensor `i`.
    fn buffer(slf: &Bound<'_, Self>, i: usize) -> PyResult<SlotBuffer> {
        let me = slf.get();
        let span = *me
            .spans
            .get(i)
            .ok_or_else(|| PyValueError::new_err(format!("no tensor {i}")))?;
        Ok(SlotBuffer::new(
            span,
            false,
            Arc::clone(&me.slot.exports),
            slf.clone().into_any().unbind(),
        ))
    }

    /// Announces the filled slot, with `scalar_fields` (JSON object text).
    fn commit(&self, py: Python<'_>, scalar_fields: &str) -> PyResult<()> {
        let inner = self.slot.take(py, "commit")?;
        py.detach(|| inner.commit(scalar_fields))
            .map_err(|e| node_error(py, &e))
    }

    /// Announces the filled slot as the next leg of `delivery` and releases
    /// the delivery (a denoiser's forward).
    fn forward(&self, py: Python<'_>, delivery: &PyDelivery, scalar_fields: &str) -> PyResult<()> {
        // Both must be free of views before either is taken, so that a
        // refusal leaves both as they were.
        for (live, id) in [
            (self.slot.exports.live(), &self.slot.request_id),
            (delivery.slot.exports.live(), &delivery.slot.request_id),
        ] {
            if live > 0 {
                return Err(PyBufferError::new_err(format!(
                    "cannot forward request {id}: {live} view(s) of its tensors are alive (delete them first)"
                )));
            }
        }
        if !self.open() {
            return Err(raise(
                py,
                format!(
                    "request {} was committed or given back already",
                    self.slot.request_id
                ),
                ErrorKind::Closed,
            ));
        }
        let received = delivery.slot.take(py, "forward")?;
        let inner = self.slot.take(py, "forward")?;
        py.detach(|| inner.forward(received, scalar_fields))
            .map_err(|e| node_error(py, &e))
    }

    /// Gives the slot back without sending.
    fn abandon(&self, py: Python<'_>) -> PyResult<()> {
        drop(self.slot.take(py, "give back")?);
        Ok(())
    }

    /// True until committed, forwarded or given back.
    #[getter]
    fn open(&self) -> bool {
        self.slot.held()
    }
}
