//! `tensorferry._native`: ferry's Python module, with the local and verbs data
//! planes. The libfabric plugin (`tensorferry_fabric._native`) is a module of
//! its own, so that this one imports on hosts without libfabric.

use pyo3::prelude::*;

/// The module.
#[pymodule]
#[pyo3(name = "_native")]
fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tensorferry_pyo3::add_to(m)
}
