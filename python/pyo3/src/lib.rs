//! The Python classes of ferry's extension modules. The main module
//! (`ferry._native`, local and verbs) and the libfabric plugin
//! (`ferry_fabric._native`) both build from this crate, with different
//! data planes enabled; the pure-Python package `ferry` on top chooses
//! between them.

mod engine;
mod options;

use pyo3::prelude::*;

pub use engine::Engine;

/// Adds this crate's classes and functions to `m`.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(engine::backends, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// The Python exception for a ferry error: `ferry.FerryError(message,
/// kind)`, defined in Python (`ferry/_errors.py`) so that both extension
/// modules raise the same class.
pub(crate) fn ferry_error(py: Python<'_>, message: String, kind: &str) -> PyErr {
    match py
        .import("ferry._errors")
        .and_then(|m| m.getattr("FerryError"))
        .and_then(|cls| cls.call1((message.clone(), kind.to_owned())))
    {
        Ok(err) => PyErr::from_value(err),
        Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
    }
}
