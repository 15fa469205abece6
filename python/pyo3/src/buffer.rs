//! `SlotBuffer`: a tensor's bytes in a pool slot, exported to Python by the
//! buffer protocol (numpy's `frombuffer`, torch's `frombuffer`, memoryview),
//! zero-copy. The slot's owner (a staging or a delivery) counts the live
//! exports and refuses to let the slot go while any is alive, so no view
//! can read a slot after it was reused; once the slot is gone, exporting
//! raises.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// The exports of one slot, shared by its buffers and its owner.
#[derive(Debug, Default)]
pub(crate) struct Exports {
    live: AtomicUsize,
    gone: AtomicBool,
}

impl Exports {
    /// Views alive now.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Marks the slot gone: exporting raises from now on.
    pub(crate) fn close(&self) {
        self.gone.store(true, Ordering::Release);
    }
}

/// A raw range of slot memory (valid while its owner holds the slot).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a span is an address range in a pool mapping that lives as long
// as the node (which the buffer's owner keeps alive); it is only read or
// written through the buffer protocol, with the GIL held, while the slot
// is held.
unsafe impl Send for Span {}
// SAFETY: as above.
unsafe impl Sync for Span {}

/// One tensor's bytes in a slot (see the module's documentation).
#[pyclass(module = "tensorferry._native", frozen)]
pub struct SlotBuffer {
    span: Span,
    readonly: bool,
    exports: Arc<Exports>,
    /// The staging or delivery that holds the slot, kept alive as long as
    /// this buffer.
    _owner: Py<PyAny>,
}

impl SlotBuffer {
    pub(crate) fn new(span: Span, readonly: bool, exports: Arc<Exports>, owner: Py<PyAny>) -> Self {
        Self {
            span,
            readonly,
            exports,
            _owner: owner,
        }
    }
}

#[pymethods]
impl SlotBuffer {
    /// Its length in bytes.
    fn __len__(&self) -> usize {
        self.span.len
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if me.exports.gone.load(Ordering::Acquire) {
            return Err(PyBufferError::new_err(
                "the slot of this tensor was released: its memory may hold another request now",
            ));
        }
        if me.readonly && flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err(
                "a received tensor is read-only (copy it to change it)",
            ));
        }
        let len = isize::try_from(me.span.len)
            .map_err(|_| PyBufferError::new_err("the tensor is larger than Python can view"))?;
        // SAFETY: `view` is the caller's buffer to fill; the memory is the
        // slot's, valid while the slot is held, which it is until `live`
        // drops to zero (the owner refuses to release before); FillInfo
        // takes a reference to `slf` for the view.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                me.span.ptr.cast(),
                len,
                c_int::from(me.readonly),
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        me.exports.live.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.live.fetch_sub(1, Ordering::AcqRel);
    }
}
