//! `tensorferry_fabric._native`: the transfer engine on ferry's libfabric data
//! plane. It links libfabric, so it is its own module: `tensorferry` imports it
//! only when `backend="fabric"` is chosen.

use pyo3::prelude::*;

/// The module.
#[pymodule]
#[pyo3(name = "_native")]
fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tensorferry_pyo3::add_to(m)
}
