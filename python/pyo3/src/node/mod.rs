//! ferry's nodes from Python: an instance (stage and commit tensors into
//! its pool's slots, receive deliveries as zero-copy views, release them)
//! and a coordinator, over ZeroMQ, on the shared-memory loopback or the
//! RDMA data planes. The pure-Python layer (`tensorferry/_node.py`) turns the
//! slot buffers into numpy arrays and torch tensors.
//!
//! A staging and a delivery borrow their node (`Staging<'n, ..>`,
//! `Delivery<'n, ..>`): here each holds an `Arc` of the node beside the
//! handle, so the node outlives it, and the handle's lifetime is extended
//! to `'static` with the owner that makes it true declared after it (Rust
//! drops fields in order). The tensor names and shapes a staging borrows
//! are kept, boxed, in the same way.
//!
//! One file per class: `instance.rs` (`InstanceNode`), `staging.rs`
//! (`Staging`), `delivery.rs` (`Delivery`), `coordinator.rs`
//! (`CoordinatorNode`); `named.rs`, the named values they take and give;
//! here, what they share.

mod coordinator;
mod delivery;
mod instance;
mod named;
mod staging;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use tensorferry::runtime::InstanceNode;

use crate::buffer::Exports;
use crate::errors::raise;
use tensorferry::runtime::ErrorKind;

pub use coordinator::PyCoordinator;
pub use delivery::PyDelivery;
pub use instance::PyInstance;
pub use staging::PyStaging;

type Node = InstanceNode;

/// What `slot` holds (`None` once taken: a staging committed, a delivery
/// released, a node closed), locked; a lock a panic poisoned still holds
/// what is to be dropped.
pub(super) fn lock_slot<T>(slot: &Mutex<Option<T>>) -> MutexGuard<'_, Option<T>> {
    slot.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a staging and a delivery share: the handle, taken once by the
/// call that ends it; the views of its slot; its request's id.
pub(super) struct Slot<T> {
    inner: Mutex<Option<T>>,
    pub(super) exports: Arc<Exports>,
    pub(super) request_id: String,
    /// What the handle's end is called in errors ("released").
    done: &'static str,
}

impl<T> Slot<T> {
    /// `handle`'s slot for `request_id`, with no views yet; `done` names
    /// its end.
    pub(super) fn new(handle: T, request_id: String, done: &'static str) -> Self {
        Self {
            inner: Mutex::new(Some(handle)),
            exports: Arc::new(Exports::default()),
            request_id,
            done,
        }
    }

    /// The handle, locked (`None` once taken).
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<T>> {
        lock_slot(&self.inner)
    }

    /// True until the handle was taken.
    pub(super) fn held(&self) -> bool {
        self.lock().is_some()
    }

    /// Takes the handle to `verb` it, refusing while views of the slot
    /// are alive, and closes the slot to new views.
    pub(super) fn take(&self, py: Python<'_>, verb: &str) -> PyResult<T> {
        let (id, live) = (&self.request_id, self.exports.live());
        if live > 0 {
            return Err(PyBufferError::new_err(format!(
                "cannot {verb} request {id}: {live} view(s) of its tensors are alive (delete them, or copy what you keep, first)"
            )));
        }
        let done = self.done;
        let taken = self.lock().take().ok_or_else(|| {
            raise(
                py,
                format!("request {id} was {done} already"),
                ErrorKind::Closed,
            )
        })?;
        self.exports.close();
        Ok(taken)
    }
}

/// Takes what `slot` holds and drops it with the GIL released: stopping a
/// node joins its progress thread, which may wait on the network.
pub(super) fn close_slot<T: Send>(py: Python<'_>, slot: &Mutex<Option<T>>) {
    let taken = lock_slot(slot).take();
    py.detach(move || drop(taken));
}
