//! `Transfer`: a handle on a transfer posted by `TransferEngine.post_write`
//! or `post_read`, over [`tensorferry::engine::Transfer`].
//!
//! The handle is shared between the Python object and its engine's list
//! of handles ([`Handles`]), so that closing the engine ends every
//! transfer still running before it returns. Once released (by
//! `release()`, leaving a `with` block, the object going away, or the
//! engine closing) the handle keeps how the transfer ended, so that
//! `state` and `wait()` still answer.

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, Weak};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tensorferry::engine::{Direction, EngineError, Transfer, TransferState};

use crate::errors;
use tensorferry::runtime::ErrorKind;

/// How long one wait holds the handle before it lets a `release()` from
/// another thread in (a release waits at most this long for waiters).
const SLICE: Duration = Duration::from_millis(50);

/// A failure kept for Python: the message and the exception's kind.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    message: String,
    kind: ErrorKind,
}

impl Failure {
    /// The failure of an engine's error (a closed engine's is `closed`,
    /// every other's its fault kind).
    pub(crate) fn of(e: &EngineError) -> Self {
        let kind = match e {
            EngineError::Closed => ErrorKind::Closed,
            e => ErrorKind::Fault(e.kind()),
        };
        Self {
            message: e.to_string(),
            kind,
        }
    }

    /// The Python exception.
    pub(crate) fn raise(self, py: Python<'_>) -> PyErr {
        errors::raise(py, self.message, self.kind)
    }
}

/// A transfer running, or how it ended once released.
enum Slot {
    Live(Transfer),
    Released(Result<(), Failure>),
}

/// What a wait found.
enum Waited {
    Done,
    Pending,
}

/// One transfer, shared by its Python object and its engine's list.
pub(crate) struct Handle {
    slot: RwLock<Slot>,
    direction: Direction,
    session: String,
    ops: usize,
    bytes: u64,
}

impl Handle {
    fn read(&self) -> RwLockReadGuard<'_, Slot> {
        self.slot.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn state(&self) -> TransferState {
        match &*self.read() {
            Slot::Live(t) => t.state(),
            Slot::Released(Ok(())) => TransferState::Done,
            Slot::Released(Err(_)) => TransferState::Failed,
        }
    }

    /// Waits until it is final or `within` has passed (`None`: until it
    /// is final, which its own deadline bounds), in slices, so that a
    /// release from another thread is not held up by a long wait.
    fn wait(&self, within: Option<Duration>) -> Result<Waited, Failure> {
        let until = within.map(|w| Instant::now().checked_add(w));
        loop {
            let slot = self.read();
            let t = match &*slot {
                Slot::Live(t) => t,
                Slot::Released(outcome) => return outcome.clone().map(|()| Waited::Done),
            };
            let slice = match until {
                Some(Some(u)) => SLICE.min(u.saturating_duration_since(Instant::now())),
                _ => SLICE,
            };
            match t.wait(slice) {
                Ok(TransferState::Pending) => {}
                Ok(_) => return Ok(Waited::Done),
                Err(e) => return Err(Failure::of(&e)),
            }
            drop(slot);
            if let Some(Some(u)) = until {
                if Instant::now() >= u {
                    return Ok(Waited::Pending);
                }
            }
        }
    }

    /// Ends the transfer if it is still running and returns once no byte
    /// of it moves; `why` is its failure if it had not finished. Does
    /// nothing to a released one.
    pub(crate) fn release(&self, why: &str) {
        let mut slot = self.slot.write().unwrap_or_else(PoisonError::into_inner);
        let Slot::Live(t) = &*slot else { return };
        let outcome = match t.wait(Duration::ZERO) {
            Ok(TransferState::Done) => Ok(()),
            Ok(_) => Err(Failure {
                message: format!(
                    "{} with {}: {why} before it finished; its operations were ended",
                    self.what(),
                    self.session
                ),
                kind: ErrorKind::Closed,
            }),
            Err(e) => Err(Failure::of(&e)),
        };
        // Dropping the transfer releases it: it returns once its data
        // plane has ended what was still running.
        *slot = Slot::Released(outcome);
    }

    /// A synchronous call's end: waits until the transfer is final, or
    /// `bound` has passed, in slices (so that closing the engine, which
    /// releases it meanwhile, is not held up), then finishes it (which
    /// the engine bounds by its deadline and grace). A transfer the
    /// closing engine released is `Closed`.
    pub(crate) fn finish(&self, bound: Instant) -> Result<(), EngineError> {
        loop {
            {
                let slot = self.read();
                let t = match &*slot {
                    Slot::Live(t) => t,
                    Slot::Released(_) => return Err(EngineError::Closed),
                };
                if matches!(t.wait(SLICE), Ok(TransferState::Pending)) && Instant::now() < bound {
                    continue;
                }
            }
            let taken = std::mem::replace(
                &mut *self.slot.write().unwrap_or_else(PoisonError::into_inner),
                Slot::Released(Ok(())),
            );
            return match taken {
                Slot::Live(t) => t.finish(),
                Slot::Released(_) => Err(EngineError::Closed),
            };
        }
    }

    fn what(&self) -> &'static str {
        match self.direction {
            Direction::Write => "write",
            Direction::Read => "read",
        }
    }
}

/// An engine's handles, so that closing it ends their transfers.
#[derive(Default)]
pub(crate) struct Handles {
    list: Mutex<HandleList>,
}

#[derive(Default)]
struct HandleList {
    weak: Vec<Weak<Handle>>,
    /// Length at which the list is next swept of handles gone.
    sweep_at: usize,
}

impl Handles {
    /// Keeps `h`; handles that went are swept when the list has doubled
    /// since the last sweep (so the list stays within twice the handles
    /// alive, at a constant cost per handle on average).
    fn add(&self, h: &Arc<Handle>) {
        let mut l = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if l.weak.len() >= l.sweep_at {
            l.weak.retain(|w| w.strong_count() > 0);
            l.sweep_at = (2 * l.weak.len()).max(64);
        }
        l.weak.push(Arc::downgrade(h));
    }

    /// Ends every transfer still running (the engine closes).
    pub(crate) fn release_all(&self) {
        let list = std::mem::take(&mut *self.list.lock().unwrap_or_else(PoisonError::into_inner));
        for h in list.weak.iter().filter_map(Weak::upgrade) {
            h.release("its engine was closed");
        }
    }
}

/// A posted transfer (see `tensorferry/_native.pyi` and `tensorferry.Transfer`).
#[pyclass(name = "Transfer", module = "tensorferry._native", frozen)]
pub struct PyTransfer {
    handle: Arc<Handle>,
}

impl PyTransfer {
    /// The Python object of `transfer`, kept in `handles`.
    pub(crate) fn new(
        transfer: Transfer,
        direction: Direction,
        session: &str,
        ops: &[tensorferry::engine::Op],
        handles: &Handles,
    ) -> Self {
        let handle = Arc::new(Handle {
            slot: RwLock::new(Slot::Live(transfer)),
            direction,
            session: session.to_owned(),
            ops: ops.len(),
            bytes: ops.iter().map(|o| o.len).sum(),
        });
        handles.add(&handle);
        Self { handle }
    }

    /// Its handle, shared with its engine's list.
    pub(crate) fn handle(&self) -> &Arc<Handle> {
        &self.handle
    }

    /// Ends it as a closed engine's (posted while the engine closed).
    pub(crate) fn release_closed(&self, py: Python<'_>) {
        let h = &self.handle;
        py.detach(|| h.release("its engine was closed"));
    }
}

fn state_name(s: TransferState) -> &'static str {
    match s {
        TransferState::Pending => "pending",
        TransferState::Done => "done",
        TransferState::Failed => "failed",
    }
}

#[pymethods]
impl PyTransfer {
    /// `"pending"`, `"done"` or `"failed"`, without waiting.
    #[getter]
    fn state(&self, py: Python<'_>) -> &'static str {
        let h = &self.handle;
        state_name(py.detach(|| h.state()))
    }

    /// Waits up to `timeout` seconds (`None`: until it is final): True
    /// once done, False if still pending; raises its failure.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let within = timeout
            .map(|s| crate::options::seconds("timeout", s))
            .transpose()?;
        let h = &self.handle;
        match py.detach(|| h.wait(within)) {
            Ok(Waited::Done) => Ok(true),
            Ok(Waited::Pending) => Ok(false),
            Err(f) => Err(f.raise(py)),
        }
    }

    /// Ends it if still pending; returns once no byte of it moves.
    fn release(&self, py: Python<'_>) {
        let h = &self.handle;
        py.detach(|| h.release("released"));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let h = &self.handle;
        format!(
            "Transfer({}, {} ops, {} bytes, session_id={:?}, state={:?})",
            h.what(),
            h.ops,
            h.bytes,
            h.session,
            self.state(py)
        )
    }
}

impl Drop for PyTransfer {
    fn drop(&mut self) {
        // Ending a transfer waits for its data plane; not with the GIL
        // held, when there is one to let go of.
        let h = Arc::clone(&self.handle);
        let released = Python::try_attach(|py| py.detach(|| h.release("released")));
        if released.is_none() {
            self.handle.release("released");
        }
    }
}
