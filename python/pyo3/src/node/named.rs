//! The named values the node classes take from Python and give back:
//! `tensorferry.Prealloc`, `tensorferry.Admission` and
//! `tensorferry.TensorSpec` (NamedTuples), read by attribute, so that a
//! field is found by its name and never by its place in a tuple.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Reads `ob` as the named value `T`; a `TypeError` naming `what` was
/// given and what was `expected` if it is not one (the derived reading
/// would raise a bare `AttributeError`).
fn read<'py, T>(ob: &Bound<'py, PyAny>, what: &str, expected: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py, Error = PyErr>,
{
    ob.extract()
        .map_err(|e| PyTypeError::new_err(format!("{what}: expected {expected}: {e}")))
}

/// An instance's `prealloc` keyword: none set aside when not given.
pub fn prealloc(ob: Option<&Bound<'_, PyAny>>) -> PyResult<tensorferry::runtime::Prealloc> {
    let p: Prealloc = match ob {
        Some(ob) => read(ob, "prealloc", "tensorferry.Prealloc(slots, slot_bytes)")?,
        None => Prealloc::default(),
    };
    Ok(p.into())
}

/// A coordinator's `admitted` keyword.
pub fn admitted(obs: &[Bound<'_, PyAny>]) -> PyResult<Vec<tensorferry::runtime::Admission>> {
    obs.iter()
        .enumerate()
        .map(|(i, ob)| {
            let what = format!("admitted[{i}]");
            read::<Admission>(ob, &what, "tensorferry.Admission(role, endpoint)").map(Into::into)
        })
        .collect()
}

/// `InstanceNode.stage`'s specs.
pub fn specs(obs: &[Bound<'_, PyAny>]) -> PyResult<Vec<TensorSpec>> {
    obs.iter()
        .enumerate()
        .map(|(i, ob)| {
            let what = format!("specs[{i}]");
            read(
                ob,
                &what,
                "tensorferry.TensorSpec(field, index, shape, dtype)",
            )
        })
        .collect()
}

/// Receive slots an instance sets aside for the fast path
/// (`tensorferry.Prealloc`).
#[derive(FromPyObject, Clone, Copy, Default)]
struct Prealloc {
    /// How many slots.
    pub slots: usize,
    /// Bytes each.
    pub slot_bytes: u64,
}

impl From<Prealloc> for tensorferry::runtime::Prealloc {
    fn from(p: Prealloc) -> Self {
        Self {
            count: p.slots,
            size: p.slot_bytes,
        }
    }
}

/// An instance a coordinator lets register (`tensorferry.Admission`).
#[derive(FromPyObject)]
struct Admission {
    /// Its role.
    pub role: String,
    /// Its work endpoint.
    pub endpoint: String,
}

impl From<Admission> for tensorferry::runtime::Admission {
    fn from(a: Admission) -> Self {
        Self {
            role: a.role,
            endpoint: a.endpoint,
        }
    }
}

/// One tensor of a slot (`tensorferry.TensorSpec`): what
/// `InstanceNode.stage` takes and `Delivery.specs` gives.
#[derive(FromPyObject)]
pub struct TensorSpec {
    /// The field it belongs to.
    pub field: String,
    /// Its index in a list-valued field; `None` for a plain field.
    pub index: Option<u64>,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its dtype's name.
    pub dtype: String,
}

/// Given as a tuple in `tensorferry.TensorSpec`'s field order, which the
/// Python layer names (`TensorSpec._make`): building the NamedTuple here
/// would tie the native module to the Python package's layout.
impl<'py> IntoPyObject<'py> for TensorSpec {
    type Target = PyTuple;
    type Output = Bound<'py, PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (self.field, self.index, self.shape, self.dtype).into_pyobject(py)
    }
}
