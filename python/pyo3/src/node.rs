//! ferry's nodes from Python: an instance (stage and commit tensors into
//! its pool's slots, receive deliveries as zero-copy views, release them)
//! and a coordinator, over ZeroMQ, on the shared-memory loopback or the
//! RDMA data planes. The pure-Python layer (`ferry/_node.py`) turns the
//! slot buffers into numpy arrays and torch tensors.
//!
//! A staging and a delivery borrow their node (`Staging<'n, ..>`,
//! `Delivery<'n, ..>`): here each holds an `Arc` of the node beside the
//! handle, so the node outlives it, and the handle's lifetime is extended
//! to `'static` with the owner that makes it true declared after it (Rust
//! drops fields in order). The tensor names and shapes a staging borrows
//! are kept, boxed, in the same way.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError};

use ferry::core::slots::{Dtype, TensorSpec};
use ferry::runtime::{
    CoordinatorNode, CoordinatorSettings, Delivery, InstanceNode, InstanceSettings, NodeError,
    Staging,
};
use ferry_zmq::{ZmqChannel, ZmqSender, ZmqSettings};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffer::{Exports, SlotBuffer, Span};
use crate::errors::{node_error, raise, Kind};
use crate::options::seconds;

type Node = InstanceNode<ZmqSender>;

/// `allow_from`'s addresses, parsed.
fn addresses(allow_from: &[String]) -> PyResult<Vec<std::net::IpAddr>> {
    allow_from
        .iter()
        .map(|a| {
            a.parse().map_err(|_| {
                PyValueError::new_err(format!("allow_from: {a:?} is not an IP address"))
            })
        })
        .collect()
}

/// Takes a staging's or a delivery's handle out of `inner` to `verb` it,
/// refusing while views of its slot are alive, and closes the slot to new
/// views; `done` says why it is not there any more.
fn take_slot<T>(
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
                Kind::Closed,
            )
        })?;
    exports.close();
    Ok(taken)
}

/// Takes what `slot` holds and drops it with the GIL released: stopping a
/// node joins its progress thread, which may wait on the network.
fn close_slot<T: Send>(py: Python<'_>, slot: &Mutex<Option<T>>) {
    let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    py.detach(move || drop(taken));
}

/// A running instance (see `ferry.Instance`).
#[pyclass(name = "InstanceNode", module = "ferry._native", frozen)]
pub struct PyInstance {
    node: Mutex<Option<Arc<Node>>>,
    role: String,
}

impl PyInstance {
    fn node(&self, py: Python<'_>) -> PyResult<Arc<Node>> {
        self.node
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| raise(py, "the instance is closed".into(), Kind::Closed))
    }
}

#[pymethods]
impl PyInstance {
    #[new]
    #[pyo3(signature = (*, role, coordinator, endpoint, backend = "local", pool_bytes = 256 << 20,
        prealloc = (0, 0), min_block = 1 << 20, head = "ferry", head_timeout = 600.0,
        allow_from = Vec::new(), **options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        role: &str,
        coordinator: &str,
        endpoint: &str,
        backend: &str,
        pool_bytes: u64,
        prealloc: (usize, u64),
        min_block: u64,
        head: &str,
        head_timeout: f64,
        allow_from: Vec<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut settings = InstanceSettings::new(role, coordinator);
        settings.prealloc = prealloc;
        settings.min_block = min_block;
        match head {
            "ferry" => {}
            "sglang" => settings = settings.under_sglang(seconds("head_timeout", head_timeout)?),
            other => {
                return Err(PyValueError::new_err(format!(
                    "head {other:?}: \"ferry\" (ferry's coordinator) or \"sglang\" (sglang's DiffusionServer)"
                )))
            }
        }
        let pool = usize::try_from(pool_bytes)
            .map_err(|_| PyValueError::new_err("pool_bytes does not fit this machine"))?;
        let plane = crate::options::data_plane(py, backend, options)?;
        let allow_from = addresses(&allow_from)?;
        let node = py
            .detach(|| {
                let ctx = zmq::Context::new();
                let channel = ZmqChannel::bind_allowing(
                    &ctx,
                    &[endpoint],
                    ZmqSettings::default(),
                    &allow_from,
                )
                .map_err(|e| NodeError::Transport {
                    verb: "bind the work endpoint",
                    source: Box::new(e),
                })?;
                plane.start(&settings, pool, channel)
            })
            .map_err(|e| node_error(py, &e))?;
        Ok(Self {
            node: Mutex::new(Some(Arc::new(node))),
            role: role.to_owned(),
        })
    }

    /// The role it registered as.
    #[getter]
    fn role(&self) -> &str {
        &self.role
    }

    /// Its data plane's session id.
    #[getter]
    fn session_id(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.node(py)?.session_id().to_owned())
    }

    /// The endpoint the coordinator sends to.
    #[getter]
    fn endpoint(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.node(py)?.endpoint().to_owned())
    }

    /// Waits until the coordinator accepted the registration.
    fn wait_registered(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let node = self.node(py)?;
        let t = seconds("timeout", timeout)?;
        py.detach(|| node.wait_registered(t))
            .map_err(|e| node_error(py, &e))
    }

    /// True while the coordinator has this instance registered.
    #[getter]
    fn is_registered(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.node(py)?.is_registered())
    }

    /// Reserves a slot for `request_id` laid out for `specs`: `(field,
    /// list_index or None, shape, dtype)` each.
    fn stage(
        &self,
        py: Python<'_>,
        request_id: &str,
        specs: Vec<(String, Option<u64>, Vec<u64>, String)>,
    ) -> PyResult<Py<PyStaging>> {
        let node = self.node(py)?;
        let mut names = Vec::with_capacity(specs.len());
        let mut shapes = Vec::with_capacity(specs.len());
        let mut kinds = Vec::with_capacity(specs.len());
        for (field, index, shape, dtype) in specs {
            let d = Dtype::from_name(&dtype).map_err(|_| {
                PyValueError::new_err(format!("tensor {field}: unknown dtype {dtype:?}"))
            })?;
            let elements = shape
                .iter()
                .try_fold(1u64, |n, d| n.checked_mul(*d))
                .and_then(|n| n.checked_mul(d.size()))
                .ok_or_else(|| {
                    PyValueError::new_err(format!("tensor {field}: its size overflows"))
                })?;
            names.push(field);
            shapes.push(shape.into_boxed_slice());
            kinds.push((index, d, elements));
        }
        let names = names.into_boxed_slice();
        let shapes = shapes.into_boxed_slice();
        // SAFETY: the references point into `node` (behind its Arc) and into
        // the boxed names and shapes, all moved into the `StagingInner`
        // below, which drops the staging first and never changes them.
        let node_ref: &'static Node = unsafe { &*Arc::as_ptr(&node) };
        let specs: Vec<TensorSpec<'static>> = names
            .iter()
            .zip(shapes.iter())
            .zip(&kinds)
            .map(|((name, shape), (index, dtype, bytes))| TensorSpec {
                // SAFETY: as above.
                field: unsafe { &*(name.as_str() as *const str) },
                list_index: *index,
                // SAFETY: as above.
                shape: unsafe { &*(&**shape as *const [u64]) },
                dtype: *dtype,
                byte_len: *bytes,
            })
            .collect();
        let mut staging = node_ref
            .stage(request_id, &specs)
            .map_err(|e| node_error(py, &e))?;
        let spans = (0..specs.len())
            .map(|i| {
                staging
                    .tensor_mut(i)
                    .map(|s| Span {
                        ptr: s.as_mut_ptr(),
                        len: s.len(),
                    })
                    .unwrap_or(Span {
                        ptr: std::ptr::NonNull::dangling().as_ptr(),
                        len: 0,
                    })
            })
            .collect();
        let data_size = staging.data_size();
        Py::new(
            py,
            PyStaging {
                inner: Mutex::new(Some(StagingInner {
                    staging,
                    _names: names,
                    _shapes: shapes,
                    _node: node,
                })),
                spans,
                exports: Arc::new(Exports::default()),
                request_id: request_id.to_owned(),
                data_size,
            },
        )
    }

    /// The next delivery, waiting at most `timeout` seconds; `None` if none
    /// came.
    fn recv(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Py<PyDelivery>>> {
        let node = self.node(py)?;
        let t = seconds("timeout", timeout)?;
        // SAFETY: the delivery borrows the node behind `node`'s Arc, which
        // `DeliveryInner` keeps alive after the delivery (dropped first).
        let node_ref: &'static Node = unsafe { &*Arc::as_ptr(&node) };
        let Some(delivery) = py.detach(|| node_ref.recv(t)) else {
            return Ok(None);
        };
        let mut tensors = Vec::new();
        for t in delivery.tensors() {
            let mut buf = vec![0u8; t.field.decoded_len()];
            let field = t
                .field
                .unescape_into(&mut buf)
                .map(str::to_owned)
                .unwrap_or_default();
            tensors.push(TensorInfo {
                field,
                list_index: t.list_index,
                dtype: t.dtype.name(),
                shape: t.dims().collect(),
                span: Span {
                    ptr: t.bytes.as_ptr().cast_mut(),
                    len: t.bytes.len(),
                },
            });
        }
        let request_id = delivery.id().to_owned();
        let scalar_fields = delivery.scalar_fields().to_owned();
        let manifest = match delivery.manifest() {
            ferry::core::wire::Manifest::Raw(raw) => raw.as_str().to_owned(),
            _ => "{}".to_owned(),
        };
        Ok(Some(Py::new(
            py,
            PyDelivery {
                inner: Mutex::new(Some(DeliveryInner {
                    delivery,
                    _node: node,
                })),
                tensors,
                exports: Arc::new(Exports::default()),
                request_id,
                scalar_fields,
                manifest,
            },
        )?))
    }

    /// The next outcome of a request this instance staged: `(request_id,
    /// sent, reason)`, or `None` after `timeout` seconds.
    fn next_outcome(
        &self,
        py: Python<'_>,
        timeout: f64,
    ) -> PyResult<Option<(String, bool, String)>> {
        let node = self.node(py)?;
        let t = seconds("timeout", timeout)?;
        Ok(py.detach(|| node.next_outcome(t)).map(|o| {
            (
                o.id.as_str().to_owned(),
                o.sent,
                o.reason.as_str().to_owned(),
            )
        }))
    }

    /// The next message that was not a transfer message (a work item):
    /// `(frame 0, frame 1)`, or `None` after `timeout` seconds.
    fn next_frame<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)>> {
        let node = self.node(py)?;
        let t = seconds("timeout", timeout)?;
        Ok(py
            .detach(|| node.next_frame(t))
            .map(|f| (PyBytes::new(py, &f.magic), PyBytes::new(py, &f.payload))))
    }

    /// Sends the application's own multipart message to the coordinator.
    fn send_frames(&self, py: Python<'_>, frames: Vec<Vec<u8>>) -> PyResult<()> {
        let node = self.node(py)?;
        let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        py.detach(|| node.send_frames(&parts))
            .map_err(|e| node_error(py, &e))
    }

    /// The node's counters and gauges (see `ferry.InstanceStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.node(py)?.stats();
        let d = PyDict::new(py);
        let m = s.metrics;
        for (k, v) in [
            ("staged", m.staged),
            ("sent", m.sent),
            ("send_failed", m.send_failed),
            ("received", m.received),
            ("released", m.released),
            ("aborted", m.aborted),
            ("writes", m.writes),
            ("write_errors", m.write_errors),
            ("bytes_written", m.bytes_written),
            ("messages_in", m.messages_in),
            ("messages_out", m.messages_out),
            ("ignored", m.ignored),
            ("bad_frames", m.bad_frames),
            ("forwarded", s.instance.forwarded),
            ("allocs_held", s.instance.allocs_held),
            ("requests_held", s.requests_held as u64),
            ("live_slots", s.live_slots),
            ("prealloc_slots", s.prealloc_slots as u64),
            ("prealloc_in_use", s.prealloc_in_use as u64),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Stops the node (its registration, its pool) once no staging or
    /// delivery of it is alive.
    fn close(&self, py: Python<'_>) {
        close_slot(py, &self.node);
    }
}

struct StagingInner {
    // Dropped first: it borrows the fields after it.
    staging: Staging<'static, 'static, ZmqSender>,
    _names: Box<[String]>,
    _shapes: Box<[Box<[u64]>]>,
    _node: Arc<Node>,
}

// The handles are consumed by methods that bind every field by name, so
// that the owners the handle borrows are dropped after the call, at the
// end of the method (a `let S { handle, .. } = temporary` would drop them
// at the end of that statement, before the handle is used).
impl StagingInner {
    fn commit(self, scalar_fields: &str) -> Result<(), NodeError> {
        let Self {
            staging,
            _names,
            _shapes,
            _node,
        } = self;
        staging.commit(scalar_fields)
    }

    fn forward(self, received: DeliveryInner, scalar_fields: &str) -> Result<(), NodeError> {
        let Self {
            staging,
            _names,
            _shapes,
            _node,
        } = self;
        let DeliveryInner {
            delivery,
            _node: _received_node,
        } = received;
        staging.forward(delivery, scalar_fields)
    }
}

/// A slot reserved for a request, to fill and commit (see `ferry.Staging`).
#[pyclass(name = "Staging", module = "ferry._native", frozen)]
pub struct PyStaging {
    inner: Mutex<Option<StagingInner>>,
    spans: Vec<Span>,
    exports: Arc<Exports>,
    request_id: String,
    data_size: u64,
}

impl PyStaging {
    fn take(&self, py: Python<'_>, verb: &str) -> PyResult<StagingInner> {
        take_slot(
            py,
            &self.inner,
            &self.exports,
            &self.request_id,
            verb,
            "committed or given back",
        )
    }
}

#[pymethods]
impl PyStaging {
    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        &self.request_id
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
            Arc::clone(&me.exports),
            slf.clone().into_any().unbind(),
        ))
    }

    /// Announces the filled slot, with `scalar_fields` (JSON object text).
    fn commit(&self, py: Python<'_>, scalar_fields: &str) -> PyResult<()> {
        let inner = self.take(py, "commit")?;
        py.detach(|| inner.commit(scalar_fields))
            .map_err(|e| node_error(py, &e))
    }

    /// Announces the filled slot as the next leg of `delivery` and releases
    /// the delivery (a denoiser's forward).
    fn forward(&self, py: Python<'_>, delivery: &PyDelivery, scalar_fields: &str) -> PyResult<()> {
        // Both must be free of views before either is taken, so that a
        // refusal leaves both as they were.
        for (live, id) in [
            (self.exports.live(), &self.request_id),
            (delivery.exports.live(), &delivery.request_id),
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
                    self.request_id
                ),
                Kind::Closed,
            ));
        }
        let received = delivery.take(py, "forward")?;
        let inner = self.take(py, "forward")?;
        py.detach(|| inner.forward(received, scalar_fields))
            .map_err(|e| node_error(py, &e))
    }

    /// Gives the slot back without sending.
    fn abandon(&self, py: Python<'_>) -> PyResult<()> {
        drop(self.take(py, "give back")?);
        Ok(())
    }

    /// True until committed, forwarded or given back.
    #[getter]
    fn open(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

struct TensorInfo {
    field: String,
    list_index: Option<u64>,
    dtype: &'static str,
    shape: Vec<u64>,
    span: Span,
}

struct DeliveryInner {
    // Dropped first: it borrows the node.
    delivery: Delivery<'static, ZmqSender>,
    _node: Arc<Node>,
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

/// A received transfer (see `ferry.Delivery`).
#[pyclass(name = "Delivery", module = "ferry._native", frozen)]
pub struct PyDelivery {
    inner: Mutex<Option<DeliveryInner>>,
    tensors: Vec<TensorInfo>,
    exports: Arc<Exports>,
    request_id: String,
    scalar_fields: String,
    manifest: String,
}

impl PyDelivery {
    fn take(&self, py: Python<'_>, verb: &str) -> PyResult<DeliveryInner> {
        take_slot(
            py,
            &self.inner,
            &self.exports,
            &self.request_id,
            verb,
            "released",
        )
    }
}

#[pymethods]
impl PyDelivery {
    /// The request id.
    #[getter]
    fn request_id(&self) -> &str {
        &self.request_id
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

    /// The tensors: `(field, list_index, dtype, shape)` each, in manifest
    /// order.
    fn specs(&self) -> Vec<(String, Option<u64>, &'static str, Vec<u64>)> {
        self.tensors
            .iter()
            .map(|t| (t.field.clone(), t.list_index, t.dtype, t.shape.clone()))
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
            Arc::clone(&me.exports),
            slf.clone().into_any().unbind(),
        ))
    }

    /// True if the coordinator aborted the request since it arrived.
    #[getter]
    fn is_aborted(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|i| i.delivery.is_aborted())
    }

    /// Frees the slot and tells the coordinator (`error`: it could not be
    /// used, and why).
    #[pyo3(signature = (error = None))]
    fn release(&self, py: Python<'_>, error: Option<&str>) -> PyResult<()> {
        let inner = self.take(py, "release")?;
        py.detach(|| inner.finish(error));
        Ok(())
    }

    /// True until released.
    #[getter]
    fn held(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

/// A running coordinator (see `ferry.Coordinator`).
#[pyclass(name = "CoordinatorNode", module = "ferry._native", frozen)]
pub struct PyCoordinator {
    node: Mutex<Option<CoordinatorNode>>,
    endpoints: Vec<String>,
}

#[pymethods]
impl PyCoordinator {
    #[new]
    #[pyo3(signature = (*, endpoints, pipeline, admitted = Vec::new(), allow_from = Vec::new()))]
    fn new(
        py: Python<'_>,
        endpoints: Vec<String>,
        pipeline: Vec<String>,
        admitted: Vec<(String, String)>,
        allow_from: Vec<String>,
    ) -> PyResult<Self> {
        if endpoints.len() != pipeline.len() {
            return Err(PyValueError::new_err(format!(
                "{} endpoint(s) for a pipeline of {} roles: over ZeroMQ the coordinator binds one endpoint per role, in pipeline order (a PULL socket cannot name a message's sender, so the endpoint it arrives at tells its role)",
                endpoints.len(),
                pipeline.len()
            )));
        }
        let roles: Vec<&str> = pipeline.iter().map(String::as_str).collect();
        let mut settings = CoordinatorSettings::new(&roles);
        settings.admitted = admitted;
        let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        let allow_from = addresses(&allow_from)?;
        let (node, bound) = py
            .detach(|| {
                let ctx = zmq::Context::new();
                let channel =
                    ZmqChannel::bind_allowing(&ctx, &eps, ZmqSettings::default(), &allow_from)
                        .map_err(|e| NodeError::Transport {
                            verb: "bind the coordinator's endpoints",
                            source: Box::new(e),
                        })?;
                let bound = channel.endpoints();
                settings.result_endpoints = bound.clone();
                CoordinatorNode::start(&settings, channel, |_| {}).map(|n| (n, bound))
            })
            .map_err(|e| node_error(py, &e))?;
        Ok(Self {
            node: Mutex::new(Some(node)),
            endpoints: bound,
        })
    }

    /// The endpoints it listens at (the first is where instances register).
    #[getter]
    fn endpoints(&self) -> Vec<String> {
        self.endpoints.clone()
    }

    /// Its figures now (see `ferry.CoordinatorStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self.node.lock().unwrap_or_else(PoisonError::into_inner);
        let node = guard
            .as_ref()
            .ok_or_else(|| raise(py, "the coordinator is closed".into(), Kind::Closed))?;
        let s = node.snapshot();
        let d = PyDict::new(py);
        d.set_item("members", s.members)?;
        d.set_item("in_flight", s.in_flight)?;
        d.set_item("prealloc_taken", s.prealloc_taken)?;
        d.set_item("delivered", s.stats.delivered)?;
        d.set_item("failed", s.stats.failed)?;
        d.set_item("fast_path", s.stats.fast_path)?;
        d.set_item("ignored", s.metrics.ignored)?;
        Ok(d)
    }

    /// Stops it.
    fn close(&self, py: Python<'_>) {
        close_slot(py, &self.node);
    }
}
