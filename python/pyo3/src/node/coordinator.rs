//! `CoordinatorNode`: a running coordinator (see `tensorferry.Coordinator`).

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use tensorferry::runtime::{CoordinatorNode, CoordinatorNodeConfig, NodeError};
use tensorferry_zmq::{zmq, ZmqChannel, ZmqConfig};

use super::{close_slot, lock_slot, named};
use crate::errors::{node_error, raise};
use tensorferry::runtime::ErrorKind;

/// A running coordinator (see `tensorferry.Coordinator`).
#[pyclass(name = "CoordinatorNode", module = "tensorferry._native", frozen)]
pub struct PyCoordinator {
    node: Mutex<Option<CoordinatorNode>>,
    endpoints: Vec<String>,
}

#[pymethods]
impl PyCoordinator {
    #[new]
    #[pyo3(signature = (*, endpoints, pipeline, admitted = Vec::new(), allow_from = Vec::new(),
        curve_key = None, curve_peers = None))]
    fn new(
        py: Python<'_>,
        endpoints: Vec<String>,
        pipeline: Vec<String>,
        admitted: Vec<Bound<'_, PyAny>>,
        allow_from: Vec<String>,
        curve_key: Option<PathBuf>,
        curve_peers: Option<PathBuf>,
    ) -> PyResult<Self> {
        if endpoints.len() != pipeline.len() {
            return Err(PyValueError::new_err(format!(
                "{} endpoint(s) for a pipeline of {} roles: over ZeroMQ the coordinator binds one endpoint per role, in pipeline order (a PULL socket cannot name a message's sender, so the endpoint it arrives at tells its role)",
                endpoints.len(),
                pipeline.len()
            )));
        }
        let roles: Vec<&str> = pipeline.iter().map(String::as_str).collect();
        let mut settings = CoordinatorNodeConfig::new(&roles);
        settings.admitted = named::admitted(&admitted)?;
        let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        // The keywords, and the environment's for the parts not given.
        let guard = crate::guard::guard(allow_from, curve_key, curve_peers)?;
        let (node, bound) = py
            .detach(|| {
                let ctx = zmq::Context::new();
                let channel = ZmqChannel::bind_guarded(&ctx, &eps, ZmqConfig::default(), &guard)
                    .map_err(|e| {
                        NodeError::transport("bind the coordinator's endpoints", e.kind(), e)
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

    /// Its figures now (see `tensorferry.CoordinatorStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = lock_slot(&self.node);
        let node = guard
            .as_ref()
            .ok_or_else(|| raise(py, "the coordinator is closed".into(), ErrorKind::Closed))?;
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
