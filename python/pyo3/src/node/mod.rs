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

use std::sync::{Mutex, PoisonError};

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

/// Takes a staging's or a delivery's handle out of `inner` to `verb` it,
/// refusing while views of its slot are alive, and closes the slot to new
/// views; `done` says why it is not there any more.
pub(super) fn take_slot<T>(
    py: Python<'_>,
    inner: &Mutex<Option<T>>,
    exports: &Exports,
    request_id: &str,
    verb: &str,
    done: &str,
) -> PyResult<T> {
    let live = exports.live();
    if live > 0 {
        return Err(PyBufferError::new_err(format!(
            "cannot {verb} request {request_id}: {live} view(s) of its tensors are alive (delete them, or copy what you keep, first)"
        )));
    }
    let taken = inner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .ok_or_else(|| {
            raise(
                py,
                format!("request {request_id} was {done} already"),
                ErrorKind::Closed,
            )
        })?;
    exports.close();
    Ok(taken)
}

/// Takes what `slot` holds and drops it with the GIL released: stopping a
/// node joins its progress thread, which may wait on the network.
pub(super) fn close_slot<T: Send>(py: Python<'_>, slot: &Mutex<Option<T>>) {
    let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    py.detach(move || drop(taken));
}
