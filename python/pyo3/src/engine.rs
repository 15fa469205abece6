//! `TransferEngine`: sglang's `BaseTransferEngine` contract over
//! [`ferry::engine::TransferEngine`].

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use ferry::engine::{EngineError, TransferEngine};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{self, Kind};
use crate::last_error::LastErrors;
use crate::options;

/// The Python exception for an engine's error (a closed engine's is
/// `closed`, every other's its fault kind).
fn raise(py: Python<'_>, e: &EngineError) -> PyErr {
    let kind = match e {
        EngineError::Closed => Kind::Closed,
        e => Kind::Fault(e.kind()),
    };
    errors::raise(py, e.to_string(), kind)
}

/// A transfer engine: register memory, write into peers' registered
/// memory by session id and address (see `ferry/_native.pyi`).
#[pyclass(name = "TransferEngine", module = "ferry._native", frozen)]
pub struct Engine {
    engine: RwLock<Option<Arc<TransferEngine>>>,
    /// Why each thread's last transfer failed, kept by the thread.
    last: LastErrors,
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

    fn transfer(&self, py: Python<'_>, session: &str, ops: Vec<ferry::engine::Op>) -> i32 {
        let engine = match self.get(py) {
            Ok(e) => e,
            Err(_) => return self.record(Err(EngineError::Closed)),
        };
        let timeout = self.timeout;
        let outcome = py.detach(|| engine.write(session, &ops, timeout));
        self.record(outcome)
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (backend = "auto", **options))]
    fn new(py: Python<'_>, backend: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let (chosen, common) = options::parse(py, backend, options)?;
        let name = chosen.name();
        let engine = py
            .detach(|| TransferEngine::open(chosen))
            .map_err(|e| raise(py, &e))?;
        Ok(Self {
            engine: RwLock::new(Some(Arc::new(engine))),
            last: LastErrors::default(),
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
        let op = ferry::engine::Op {
            src: src_addr,
            dst: dst_addr,
            len: length,
        };
        self.transfer(py, dst_session_id, vec![op])
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
        if src_addrs.len() != dst_addrs.len() || dst_addrs.len() != lengths.len() {
            return self.record(Err(EngineError::BatchShape {
                sources: src_addrs.len(),
                dests: dst_addrs.len(),
                lengths: lengths.len(),
            }));
        }
        let ops = src_addrs
            .into_iter()
            .zip(dst_addrs)
            .zip(lengths)
            .map(|((src, dst), len)| ferry::engine::Op { src, dst, len })
            .collect();
        self.transfer(py, dst_session_id, ops)
    }

    /// Closes the engine: its registrations end, and later calls fail.
    fn close(&self, py: Python<'_>) {
        let engine = self
            .engine
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach(move || drop(engine));
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

/// The backends this module can open.
#[pyfunction]
pub(crate) fn backends() -> Vec<&'static str> {
    options::names()
}
