//! ferry's Python exceptions: every error a call raises is a subclass of
//! `tensorferry.FerryError` chosen by its kind (`tensorferry/_errors.py` defines the
//! classes, so that both extension modules raise the same ones).
//!
//! The kinds are the core's fault kinds ([`FaultKind::ALL`], with their
//! names and the codes sglang's `transfer_sync` returns), followed by the
//! kinds of the calls around the data plane ([`ErrorKind::OWN`]: a node's
//! refusals, a closed engine or node); the runtime's [`NodeError::kind`]
//! decides which a node's error is. The module exports both
//! tables (`FAULT_CODES`, `ERROR_KINDS`); the Python package builds its
//! codes from them and its tests check its classes against them.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensorferry::runtime::{ErrorKind, NodeError};
use tensorferry_core::transport::FaultKind;

/// An i/o error (the core's catch-all).
#[cfg(feature = "verbs")]
pub(crate) const IO: ErrorKind = ErrorKind::Fault(FaultKind::Io);

/// The Python exception for a ferry error: the `tensorferry.FerryError`
/// subclass of `kind`, made by `tensorferry._errors.error_for(message, kind)`.
/// Should the Python package be unimportable, a `RuntimeError`.
pub(crate) fn raise(py: Python<'_>, message: String, kind: ErrorKind) -> PyErr {
    match py
        .import("tensorferry._errors")
        .and_then(|m| m.getattr("error_for"))
        .and_then(|f| f.call1((message.clone(), kind.name())))
    {
        Ok(err) => PyErr::from_value(err),
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}

/// The Python exception for a node's error.
pub(crate) fn node_error(py: Python<'_>, e: &NodeError) -> PyErr {
    raise(py, e.to_string(), e.kind())
}

/// Adds the tables to the module: `FAULT_CODES` (each fault kind's name
/// and code, a dict in the core's order) and `ERROR_KINDS` (every kind's
/// name, fault kinds first, a tuple).
pub(crate) fn add_tables(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let codes = PyDict::new(py);
    for k in FaultKind::ALL {
        codes.set_item(k.as_name(), k.code())?;
    }
    m.add("FAULT_CODES", codes)?;
    let names = FaultKind::ALL
        .into_iter()
        .map(ErrorKind::Fault)
        .chain(ErrorKind::OWN)
        .map(ErrorKind::name)
        .collect::<Vec<_>>();
    m.add("ERROR_KINDS", PyTuple::new(py, names)?)?;
    Ok(())
}
