//! The Python classes of ferry's extension modules. The main module
//! (`tensorferry._native`, local and verbs) and the libfabric plugin
//! (`tensorferry_fabric._native`) both build from this crate, with different
//! data planes enabled; the pure-Python package `ferry` on top chooses
//! between them.

mod buffer;
mod engine;
mod errors;
mod guard;
mod last_error;
mod node;
mod options;
mod transfer;

use pyo3::prelude::*;

pub use engine::Engine;

/// Adds this crate's classes and functions to `m`.
pub fn add_to(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log_to_stderr();
    m.add_class::<Engine>()?;
    m.add_class::<transfer::PyTransfer>()?;
    m.add_class::<node::PyInstance>()?;
    m.add_class::<node::PyStaging>()?;
    m.add_class::<node::PyDelivery>()?;
    m.add_class::<node::PyCoordinator>()?;
    m.add_class::<buffer::SlotBuffer>()?;
    m.add_class::<guard::PyGuard>()?;
    m.add_function(wrap_pyfunction!(engine::backends, m)?)?;
    errors::add_tables(m)?;
    m.add("MAX_NOTIFICATION", tensorferry::engine::MAX_NOTIFICATION)?;
    m.add("END_GRACE", tensorferry::engine::END_GRACE.as_secs_f64())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// With `FERRY_LOG` set (`info`, `tensorferry=debug`, ...), the runtime's logs go
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
