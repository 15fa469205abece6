//! `TransferEngine`: sglang's `BaseTransferEngine` contract over
//! [`tensorferry::engine::TransferEngine`], with the engine's transfers by
//! handle (`post_write`, `post_read`), reads, and notifications.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tensorferry::engine::{Direction, EngineConfig, EngineError, Op, TransferEngine};

use crate::last_error::LastErrors;
use crate::options;
use crate::transfer::{Failure, Handles, PyTransfer};

/// The Python exception for an engine's error (a closed engine's is
/// `closed`, every other's its fault kind).
fn raise(py: Python<'_>, e: &EngineError) -> PyErr {
    Failure::of(e).raise(py)
}

/// A transfer engine: register memory, write into and read from peers'
/// registered memory by session id and address, notify peers (see
/// `tensorferry/_native.pyi`).
#[pyclass(name = "TransferEngine", module = "tensorferry._native", frozen)]
pub struct Engine {
    engine: RwLock<Option<Arc<TransferEngine>>>,
    /// Why each thread's last transfer failed, kept by the thread.
    last: LastErrors,
    /// The transfers posted, ended when the engine closes.
    handles: Handles,
    backend: &'static str,
    timeout: Duration,
}

impl Engine {
    fn get(&self, py: Python<'_>) -> PyResult<Arc<TransferEngine>> {
        self.engine
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| raise(py, &EngineError::Closed))
    }

    fn record(&self, outcome: Result<(), EngineError>) -> i32 {
        match outcome {
            Ok(()) => {
                self.last.clear();
                0
            }
            Err(e) => {
                self.last.set(e.to_string());
                e.kind().code()
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.engine
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// A synchronous transfer, as sglang's calls return it: 0, or the
    /// failure's code (its reason kept for `last_error`). It is posted and
    /// kept with the engine's handles, so that closing the engine from
    /// another thread ends it, and waited for here.
    fn transfer(&self, py: Python<'_>, direction: Direction, session: &str, ops: &[Op]) -> i32 {
        let engine = match self.get(py) {
            Ok(e) => e,
            Err(_) => return self.record(Err(EngineError::Closed)),
        };
        let timeout = self.timeout;
        let posted = py.detach(|| engine.post(direction, session, ops, timeout, None));
        let transfer = match posted {
            Ok(t) => t,
            Err(e) => return self.record(Err(e)),
        };
        let handle = PyTransfer::new(transfer, direction, session, ops, &self.handles);
        // Kept before this look, closed after: `close` either ended it
        // with the others or left it to be ended here.
        if self.is_closed() {
            handle.release_closed(py);
        }
        // A timeout too long to add is never reached: so is its bound.
        let now = std::time::Instant::now();
        let bound = now
            .checked_add(timeout)
            .and_then(|d| d.checked_add(tensorferry::engine::END_GRACE))
            .unwrap_or_else(|| now + std::time::Duration::from_secs(100 * 365 * 24 * 3600));
        let h = handle.handle();
        let outcome = py.detach(|| h.finish(bound));
        drop(engine);
        self.record(outcome)
    }

    /// [`transfer`](Self::transfer) of a batch given as three lists.
    fn transfer_lists(
        &self,
        py: Python<'_>,
        direction: Direction,
        session: &str,
        sources: &[u64],
        dests: &[u64],
        lengths: &[u64],
    ) -> i32 {
        match tensorferry::engine::ops_of_lists(sources, dests, lengths) {
            Ok(ops) => self.transfer(py, direction, session, &ops),
            Err(e) => self.record(Err(e)),
        }
    }

    /// Posts a transfer and returns its handle; raises if it is refused.
    fn post(
        &self,
        py: Python<'_>,
        direction: Direction,
        session: &str,
        ops: Vec<Op>,
        notify: Option<&[u8]>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let timeout = match timeout {
            Some(s) => options::seconds("timeout", s)?,
            None => self.timeout,
        };
        let engine = self.get(py)?;
        let transfer = py
            .detach(|| engine.post(direction, session, &ops, timeout, notify))
            .map_err(|e| raise(py, &e))?;
        let handle = PyTransfer::new(transfer, direction, session, &ops, &self.handles);
        // Kept before this look, closed after: `close` either ended it
        // with the others or left it to be ended here.
        if self.is_closed() {
            handle.release_closed(py);
        }
        Ok(handle)
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (backend = "auto", **options))]
    fn new(py: Python<'_>, backend: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let (chosen, common) = options::parse(py, backend, options)?;
        let name = chosen.name();
        let mut opened = EngineConfig::default();
        opened.notify_host = common.notify_host;
        opened.guard = Some(common.guard);
        let engine = py
            .detach(|| TransferEngine::open_with(chosen, opened))
            .map_err(|e| raise(py, &e))?;
        Ok(Self {
            engine: RwLock::new(Some(Arc::new(engine))),
            last: LastErrors::default(),
            handles: Handles::default(),
            backend: name,
            timeout: common.timeout,
        })
    }

    /// The session id peers pass as `dst_session_id`.
    #[getter]
    fn session_id(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.session_id())
    }

    /// False: the engine moves host memory.
    #[getter]
    fn supports_gpu_direct(&self) -> bool {
        false
    }

    /// The data plane in use: `local`, `fabric` or `verbs`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// Why the calling thread's last transfer failed (`None` after a
    /// success).
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.last.get()
    }

    /// How many live threads hold a failure of this engine for
    /// `last_error` (private: for the tests, which check that threads
    /// that ended hold none).
    #[getter]
    fn _last_error_holders(&self) -> usize {
        self.last.holders()
    }

    /// Registers `length` bytes at `ptr` for peers to write into and this
    /// engine to write from; raises `FerryError` if it cannot.
    fn register_buffer(&self, py: Python<'_>, ptr: u64, length: u64) -> PyResult<()> {
        let engine = self.get(py)?;
        // SAFETY: sglang's contract, which this method documents: the
        // caller keeps the memory alive and mapped until it deregisters
        // it or closes the engine, and expects peers to write into it.
        py.detach(|| unsafe { engine.register(ptr, length) })
            .map_err(|e| raise(py, &e))
    }

    /// Ends the registration of the region at `ptr`; once it returns, no
    /// peer's write into it is running.
    fn deregister_buffer(&self, py: Python<'_>, ptr: u64) -> PyResult<()> {
        let engine = self.get(py)?;
        py.detach(|| engine.deregister(ptr))
            .map_err(|e| raise(py, &e))
    }

    /// Writes `length` bytes from `src_addr` (here) to `dst_addr` (in the
    /// peer `dst_session_id`); 0 once every byte is at the peer, negative
    /// on failure (see `last_error`).
    fn transfer_sync(
        &self,
        py: Python<'_>,
        dst_session_id: &str,
        src_addr: u64,
        dst_addr: u64,
        length: u64,
    ) -> i32 {
        let op = Op {
            src: src_addr,
            dst: dst_addr,
            len: length,
        };
        self.transfer(py, Direction::Write, dst_session_id, &[op])
    }

    /// Writes every `(src, dst, length)` of the three lists; 0 once all
    /// are at the peer, negative on any failure.
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        dst_session_id: &str,
        src_addrs: Vec<u64>,
        dst_addrs: Vec<u64>,
        lengths: Vec<u64>,
    ) -> i32 {
        self.transfer_lists(
            py,
            Direction::Write,
            dst_session_id,
            &src_addrs,
            &dst_addrs,
            &lengths,
        )
    }

    /// Reads `length` bytes from `remote_addr` (in the peer
    /// `src_session_id`) into `local_addr` (here); 0 once every byte is
    /// here, negative on failure (see `last_error`).
    fn read_sync(
        &self,
        py: Python<'_>,
        src_session_id: &str,
        local_addr: u64,
        remote_addr: u64,
        length: u64,
    ) -> i32 {
        let op = Op {
            src: remote_addr,
            dst: local_addr,
            len: length,
        };
        self.transfer(py, Direction::Read, src_session_id, &[op])
    }

    /// Reads every `(local, remote, length)` of the three lists; 0 once
    /// all are here, negative on any failure.
    fn batch_read_sync(
        &self,
        py: Python<'_>,
        src_session_id: &str,
        local_addrs: Vec<u64>,
        remote_addrs: Vec<u64>,
        lengths: Vec<u64>,
    ) -> i32 {
        self.transfer_lists(
            py,
            Direction::Read,
            src_session_id,
            &remote_addrs,
            &local_addrs,
            &lengths,
        )
    }

    /// Posts writes of every `(src, dst, length)` into the peer
    /// `dst_session_id` and returns their `Transfer`; with `notify`, the
    /// peer is sent it once every byte is there.
    #[pyo3(signature = (dst_session_id, src_addrs, dst_addrs, lengths, *, notify = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn post_write(
        &self,
        py: Python<'_>,
        dst_session_id: &str,
        src_addrs: Vec<u64>,
        dst_addrs: Vec<u64>,
        lengths: Vec<u64>,
        notify: Option<&[u8]>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let ops = tensorferry::engine::ops_of_lists(&src_addrs, &dst_addrs, &lengths)
            .map_err(|e| raise(py, &e))?;
        self.post(py, Direction::Write, dst_session_id, ops, notify, timeout)
    }

    /// Posts reads of every `(local, remote, length)` from the peer
    /// `src_session_id` and returns their `Transfer`; with `notify`, the
    /// peer is sent it once every byte is here.
    #[pyo3(signature = (src_session_id, local_addrs, remote_addrs, lengths, *, notify = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn post_read(
        &self,
        py: Python<'_>,
        src_session_id: &str,
        local_addrs: Vec<u64>,
        remote_addrs: Vec<u64>,
        lengths: Vec<u64>,
        notify: Option<&[u8]>,
        timeout: Option<f64>,
    ) -> PyResult<PyTransfer> {
        let ops = tensorferry::engine::ops_of_lists(&remote_addrs, &local_addrs, &lengths)
            .map_err(|e| raise(py, &e))?;
        self.post(py, Direction::Read, src_session_id, ops, notify, timeout)
    }

    /// Sends `message` to the peer engine `dst_session_id`, after what
    /// this engine sent it before; raises if it cannot.
    fn notify(&self, py: Python<'_>, dst_session_id: &str, message: &[u8]) -> PyResult<()> {
        let engine = self.get(py)?;
        py.detach(|| engine.notify(dst_session_id, message))
            .map_err(|e| raise(py, &e))
    }

    /// Every notification that arrived since the last call, as
    /// `(sender's session id, message)`, in order per sender; does not
    /// wait.
    fn notifications<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let engine = self.get(py)?;
        let got = py
            .detach(|| engine.notifications())
            .map_err(|e| raise(py, &e))?;
        PyList::new(
            py,
            got.into_iter()
                .map(|n| (n.from, PyBytes::new(py, &n.message))),
        )
    }

    /// A descriptor that polls readable when notifications may have
    /// arrived that `notifications` has not taken (a hint: the call may
    /// find none); valid until `close`, never to be closed by the caller.
    fn notification_fd(&self, py: Python<'_>) -> PyResult<i32> {
        use std::os::fd::AsRawFd;
        let engine = self.get(py)?;
        Ok(engine.notification_fd().as_raw_fd())
    }

    /// Closes the engine: transfers still pending are ended, synchronous
    /// calls of other threads among them, and it returns once every call
    /// other threads were making on it has returned (each is bounded:
    /// a transfer by its deadline and the engine's grace, a notification
    /// by its send timeout), so that once it returns no byte of any of
    /// them moves. Its registrations end, and later calls fail.
    fn close(&self, py: Python<'_>) {
        let engine = self
            .engine
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let handles = &self.handles;
        py.detach(move || {
            handles.release_all();
            if let Some(engine) = engine {
                // Each call holds the engine until it returns.
                while Arc::strong_count(&engine) > 1 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(engine);
            }
        });
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.get(py) {
            Ok(e) => format!(
                "TransferEngine(backend={:?}, session_id={:?})",
                self.backend,
                e.session_id()
            ),
            Err(_) => format!("TransferEngine(backend={:?}, closed)", self.backend),
        }
    }
}

/// The data planes this module has, `auto` first.
#[pyfunction]
pub(crate) fn backends() -> Vec<&'static str> {
    options::names()
}
