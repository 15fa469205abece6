//! The Python classes of ferry's extension modules. The main module
//! (`ferry._native`, local and verbs) and the libfabric plugin
//! (`ferry_fabric._native`) both build from this crate, with different
//! data planes enabled; the pure-Python package `ferry` on top chooses
//! between them.

mod buffer;
mod engine;
mod node;
mod options;

use pyo3::prelude::*;

pub use engine::Engine;

/// Adds this crate's classes and functions to `m`.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log_to_stderr();
    m.add_class::<Engine>()?;
    m.add_class::<node::PyInstance>()?;
    m.add_class::<node::PyStaged>()?;
    m.add_class::<node::PyReceived>()?;
    m.add_class::<node::PyCoordinator>()?;
    m.add_class::<buffer::SlotBuffer>()?;
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

/// With `FERRY_LOG` set (`info`, `ferry=debug`, ...), the runtime's logs go
/// to stderr; without it, nowhere. The first module imported installs it.
fn log_to_stderr() {
    let Ok(filter) = std::env::var("FERRY_LOG") else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::new(filter);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
