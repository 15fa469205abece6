//! `InstanceNode`: a running instance (see `tensorferry.Instance`): it stages
//! requests into [`PyStaging`]s and receives [`PyDelivery`]s.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tensorferry::core::slots::{Dtype, TensorSpec};
use tensorferry::runtime::{InstanceNodeConfig, NodeError};
use tensorferry_zmq::{zmq, ZmqChannel, ZmqConfig};

use super::delivery::{DeliveryInner, PyDelivery, TensorInfo};
use super::named;
use super::staging::{PyStaging, StagingInner};
use super::{close_slot, lock_slot, Node, Slot};
use crate::buffer::Span;
use crate::errors::{node_error, raise};
use crate::options::seconds;
use tensorferry::runtime::ErrorKind;

/// A running instance (see `tensorferry.Instance`).
#[pyclass(name = "InstanceNode", module = "tensorferry._native", frozen)]
pub struct PyInstance {
    node: Mutex<Option<Arc<Node>>>,
    role: String,
}

impl PyInstance {
    fn node(&self, py: Python<'_>) -> PyResult<Arc<Node>> {
        lock_slot(&self.node)
            .clone()
            .ok_or_else(|| raise(py, "the instance is closed".into(), ErrorKind::Closed))
    }
}

#[pymethods]
impl PyInstance {
    #[new]
    #[pyo3(signature = (*, role, coordinator, endpoint, backend = "shm", pool_bytes = 256 << 20,
        prealloc = None, min_block = 1 << 20, head = "ferry", head_timeout = 600.0,
        allow_from = Vec::new(), curve_key = None, curve_peers = None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        role: &str,
        coordinator: &str,
        endpoint: &str,
        backend: &str,
        pool_bytes: u64,
        prealloc: Option<Bound<'_, PyAny>>,
        min_block: u64,
        head: &str,
        head_timeout: f64,
        allow_from: Vec<String>,
        curve_key: Option<std::path::PathBuf>,
        curve_peers: Option<std::path::PathBuf>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut settings = InstanceNodeConfig::new(role, coordinator);
        settings.config.prealloc = named::prealloc(prealloc.as_ref())?;
        settings.config.min_block = min_block;
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
        let mut plane = crate::options::data_plane(py, backend, options)?;
        // The keywords, and the environment's for the parts not given.
        let guard = crate::guard::guard(allow_from, curve_key, curve_peers)?;
        settings
            .check_guard(&guard)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        plane.guard(&guard);
        let node = py
            .detach(|| {
                let ctx = zmq::Context::new();
                let channel =
                    ZmqChannel::bind_guarded(&ctx, &[endpoint], ZmqConfig::default(), &guard)
                        .map_err(|e| NodeError::transport("bind the work endpoint", e.kind(), e))?;
                plane.start_instance(&settings, pool, channel)
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

    /// Reserves a slot for `request_id` laid out for `specs`
    /// (`tensorferry.TensorSpec`s).
    fn stage(
        &self,
        py: Python<'_>,
        request_id: &str,
        specs: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyStaging>> {
        let node = self.node(py)?;
        let specs = named::specs(&specs)?;
        let mut names = Vec::with_capacity(specs.len());
        let mut shapes = Vec::with_capacity(specs.len());
        let mut kinds = Vec::with_capacity(specs.len());
        for named::TensorSpec {
            field,
            index,
            shape,
            dtype,
        } in specs
        {
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
                slot: Slot::new(
                    StagingInner {
                        staging,
                        _names: names,
                        _shapes: shapes,
                        _node: node,
                    },
                    request_id.to_owned(),
                    "committed or given back",
                ),
                spans,
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
            tensorferry::core::wire::Manifest::Raw(raw) => raw.as_str().to_owned(),
            _ => "{}".to_owned(),
        };
        Ok(Some(Py::new(
            py,
            PyDelivery {
                slot: Slot::new(
                    DeliveryInner {
                        delivery,
                        _node: node,
                    },
                    request_id,
                    "released",
                ),
                tensors,
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

    /// The node's counters and gauges (see `tensorferry.InstanceStats`).
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
