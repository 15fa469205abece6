//! The keyword options of `TransferEngine(backend=..., **options)` and
//! `Instance(backend=..., **options)`: the data plane's are read by the
//! library's one parser ([`DataPlane::parse`]) as text, which names an
//! option the chosen plane does not take; the engine's own (`timeout`,
//! `notify_host`, the guard's) are taken out first.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensorferry::plane::{DataPlane, PlaneError, AUTO};

/// The engine's options beside its data plane's.
pub(crate) struct Common {
    /// How long a transfer may take before it fails, unless its call
    /// names another.
    pub timeout: Duration,
    /// The address of this host peers send notifications to
    /// (`EngineConfig::notify_host`; `None`: the engine's default).
    pub notify_host: Option<String>,
    /// Who may reach the engine's endpoints: `allow_from`, `curve_key`
    /// and `curve_peers`, with the environment's for the parts not given
    /// (the allow-list; CURVE's key and peers).
    pub guard: tensorferry_zmq::Guard,
}

/// Takes `key` out of `options`, converted, if present.
fn take<'py, T: FromPyObjectOwned<'py>>(
    options: &mut Vec<(String, Bound<'py, PyAny>)>,
    key: &str,
) -> PyResult<Option<T>> {
    let Some(at) = options.iter().position(|(k, _)| k == key) else {
        return Ok(None);
    };
    let (_, v) = options.remove(at);
    v.extract::<T>().map(Some).map_err(|e| {
        let e: PyErr = e.into();
        PyTypeError::new_err(format!("option {key}: {e}"))
    })
}

/// `v` seconds as a duration, or an error naming `what`.
pub(crate) fn seconds(what: &str, v: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| PyValueError::new_err(format!("{what}: {v} is not a duration in seconds")))
}

/// The keyword arguments as (name, object) pairs.
fn pairs<'py>(options: Option<&Bound<'py, PyDict>>) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    match options {
        Some(d) => d
            .iter()
            .map(|(k, v)| Ok((k.extract::<String>()?, v)))
            .collect(),
        None => Ok(Vec::new()),
    }
}

/// Reads an engine's `backend` and `options`: its own options, then the
/// data plane's.
pub(crate) fn parse(
    py: Python<'_>,
    backend: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(DataPlane, Common)> {
    let mut opts = pairs(options)?;
    let timeout = match take::<f64>(&mut opts, "timeout")? {
        Some(s) => seconds("option timeout", s)?,
        None => Duration::from_secs(30),
    };
    let notify_host = take::<String>(&mut opts, "notify_host")?;
    let allow_from = match opts.iter().position(|(k, _)| k == "allow_from") {
        Some(at) => crate::guard::addresses(Some(&opts.remove(at).1))?,
        None => Vec::new(),
    };
    let curve_key = take::<std::path::PathBuf>(&mut opts, "curve_key")?;
    let curve_peers = take::<std::path::PathBuf>(&mut opts, "curve_peers")?;
    let guard = crate::guard::guard(allow_from, curve_key, curve_peers)?;
    let plane = plane(py, backend, opts)?;
    Ok((
        plane,
        Common {
            timeout,
            notify_host,
            guard,
        },
    ))
}

/// The data planes this module has, `auto` first.
pub(crate) fn names() -> Vec<&'static str> {
    std::iter::once(AUTO)
        .chain(DataPlane::names().iter().copied())
        .collect()
}

#[cfg(feature = "verbs")]
fn first_device() -> Result<String, String> {
    match tensorferry_verbs::device_names() {
        Ok(names) => names
            .into_iter()
            .next()
            .ok_or_else(|| "the verbs data plane finds no RDMA device on this host".to_owned()),
        Err(e) => Err(format!(
            "the verbs data plane finds no RDMA device on this host: {e}"
        )),
    }
}

/// Reads a node's `backend` and its options
/// (`tensorferry.Instance(backend=..., **options)`): all of them are the
/// data plane's.
pub(crate) fn data_plane(
    py: Python<'_>,
    backend: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<DataPlane> {
    let opts = pairs(options)?;
    if opts.iter().any(|(k, _)| k == "timeout") {
        return Err(PyTypeError::new_err(
            "option \"timeout\" is the transfer engine's; a node's timeouts are its settings",
        ));
    }
    plane(py, backend, opts)
}

/// `v`, the value of option `key`, as the text the library's parser
/// reads: a string or a path as it is, a number as Python writes it;
/// anything else (`None`, a bool, a list) is a `TypeError` naming it.
fn option_text(key: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
    if v.is_instance_of::<PyString>() {
        return v.extract::<String>();
    }
    if (v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>())
        || v.is_instance_of::<PyFloat>()
    {
        return Ok(v.str()?.to_string());
    }
    if let Ok(path) = v.extract::<std::path::PathBuf>() {
        return Ok(path.display().to_string());
    }
    Err(PyTypeError::new_err(format!(
        "option {key}: expected a string or a number, got {}",
        v.get_type().name()?
    )))
}

/// The data plane `backend` with `opts` applied, each as text
/// ([`option_text`]), read by [`DataPlane::parse`].
fn plane(
    py: Python<'_>,
    backend: &str,
    opts: Vec<(String, Bound<'_, PyAny>)>,
) -> PyResult<DataPlane> {
    let mut given: Vec<(String, String)> = Vec::with_capacity(opts.len());
    for (key, v) in opts {
        let value = option_text(&key, &v)?;
        // The local plane's copy threshold went by another name.
        let key = if key == "parallel_min" {
            let warning = py.get_type::<pyo3::exceptions::PyDeprecationWarning>();
            PyErr::warn(
                py,
                &warning,
                c"option parallel_min is now split_at (as shared memory's)",
                1,
            )?;
            "split_at".to_owned()
        } else {
            key
        };
        given.push((key, value));
    }
    // Python's verbs plane takes the host's first device when none is named.
    #[cfg(feature = "verbs")]
    if backend == "verbs" && !given.iter().any(|(k, _)| k == "device") {
        let device =
            first_device().map_err(|why| crate::errors::raise(py, why, crate::errors::IO))?;
        given.push(("device".to_owned(), device));
    }
    DataPlane::parse(backend, given).map_err(|e| match e {
        PlaneError::UnknownOption { .. } => PyTypeError::new_err(e.to_string()),
        PlaneError::Unknown { .. } => PyValueError::new_err(format!(
            "backend {backend:?} is not in this module (it has: {})",
            names().join(", ")
        )),
        PlaneError::NotBuilt { name, .. } => PyValueError::new_err(not_built(name)),
        _ => PyValueError::new_err(format!("backend {backend:?}: {e}")),
    })
}

/// What a Python user installs for the data plane `name` this module was
/// built without (the library's own message names a Cargo feature, which
/// means nothing to a wheel's user): libfabric is the `tensorferry-fabric`
/// plugin, which `tensorferry` imports for `backend="fabric"`; every other
/// plane is in the `tensorferry` wheel itself.
fn not_built(name: &str) -> String {
    if name == "fabric" {
        "backend \"fabric\" is ferry's libfabric plugin, which this module does not have: \
         install it with `pip install tensorferry-fabric` (its wheel carries libfabric)"
            .to_owned()
    } else {
        format!(
            "backend {name:?} is not in this build of tensorferry's module; the tensorferry \
             wheel from PyPI has it (`pip install --force-reinstall tensorferry`)"
        )
    }
}
