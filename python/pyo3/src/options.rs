//! The keyword options of `TransferEngine(backend=..., **options)`, read
//! into the Rust backend's configuration. An option the chosen backend
//! does not take is an error that names it, never ignored.

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensorferry::engine::{Backend, LocalConfig};
use tensorferry::runtime::{DataPlane, PlaneError};

/// Options every backend takes.
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

/// Reads `backend` and `options` into a backend configuration.
pub(crate) fn parse(
    py: Python<'_>,
    backend: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Backend, Common)> {
    let mut opts: Vec<(String, Bound<'_, PyAny>)> = match options {
        Some(d) => d
            .iter()
            .map(|(k, v)| Ok((k.extract::<String>()?, v)))
            .collect::<PyResult<_>>()?,
        None => Vec::new(),
    };
    // Only the verbs backend raises through the interpreter here.
    let _ = py;
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
    let chosen = match backend {
        "auto" => Backend::auto(),
        "local" => Backend::Local(LocalConfig::default()),
        #[cfg(feature = "fabric")]
        "fabric" => {
            let provider: String = take(&mut opts, "provider")?.unwrap_or_else(|| "auto".into());
            let provider = provider
                .parse::<tensorferry_fabric::Provider>()
                .map_err(|e| PyValueError::new_err(format!("option provider: {e}")))?;
            Backend::Fabric(tensorferry_fabric::FabricConfig::new(provider))
        }
        #[cfg(feature = "verbs")]
        "verbs" => {
            let device = match take::<String>(&mut opts, "device")? {
                Some(d) => d,
                None => first_device()
                    .map_err(|why| crate::errors::raise(py, why, crate::errors::IO))?,
            };
            Backend::Verbs(tensorferry_verbs::VerbsConfig::new(device))
        }
        other => {
            let hint = if other == "shm" {
                "; the engine's same-host plane is \"local\" (\"shm\" is a node's other name for its own)"
            } else {
                ""
            };
            return Err(PyValueError::new_err(format!(
                "backend {other:?} is not in this module (it has: {}){hint}",
                names().join(", ")
            )));
        }
    };
    let chosen = configure(chosen, &mut opts)?;
    if let Some((key, _)) = opts.first() {
        return Err(PyTypeError::new_err(format!(
            "option {key:?} is not one the {} backend takes",
            chosen.name()
        )));
    }
    Ok((
        chosen,
        Common {
            timeout,
            notify_host,
            guard,
        },
    ))
}

/// The backends this module has.
pub(crate) fn names() -> Vec<&'static str> {
    let mut v = vec!["auto", "local"];
    if cfg!(feature = "fabric") {
        v.push("fabric");
    }
    if cfg!(feature = "verbs") {
        v.push("verbs");
    }
    v
}

#[cfg(feature = "verbs")]
fn first_device() -> Result<String, String> {
    match tensorferry_verbs::device_names() {
        Ok(names) => names
            .into_iter()
            .next()
            .ok_or_else(|| "the verbs backend finds no RDMA device on this host".to_owned()),
        Err(e) => Err(format!(
            "the verbs backend finds no RDMA device on this host: {e}"
        )),
    }
}

/// Applies the backend's own options.
fn configure(backend: Backend, opts: &mut Vec<(String, Bound<'_, PyAny>)>) -> PyResult<Backend> {
    Ok(match backend {
        Backend::Local(mut c) => {
            if let Some(t) = take::<usize>(opts, "threads")? {
                c.threads = t.max(1);
            }
            if let Some(m) = take::<u64>(opts, "parallel_min")? {
                c.parallel_min = m;
            }
            Backend::Local(c)
        }
        #[cfg(feature = "fabric")]
        Backend::Fabric(mut c) => {
            if let Some(s) = take::<String>(opts, "source")? {
                c.source = Some(s);
            }
            if let Some(m) = take::<u64>(opts, "max_chunk")? {
                c.max_chunk = m;
            }
            if let Some(s) = take::<f64>(opts, "write_timeout")? {
                c.write_timeout = seconds("option write_timeout", s)?;
            }
            Backend::Fabric(c)
        }
        #[cfg(feature = "verbs")]
        Backend::Verbs(mut c) => {
            if let Some(p) = take::<u8>(opts, "port")? {
                c.port = p;
            }
            if let Some(g) = take::<u8>(opts, "gid_index")? {
                c.gid = tensorferry_verbs::GidChoice::Index(g);
            }
            if let Some(l) = take::<String>(opts, "listen")? {
                c.listen = Some(l);
            }
            if let Some(s) = take::<f64>(opts, "write_timeout")? {
                c.write_timeout = seconds("option write_timeout", s)?;
            }
            Backend::Verbs(c)
        }
        #[allow(unreachable_patterns)]
        other => other,
    })
}

/// Reads a node's `backend` (`local`, also `shm`; `fabric`; `verbs`) and
/// its options (`tensorferry.Instance(backend=..., **options)`) into the
/// library's data plane: every option goes to [`DataPlane::parse`] as
/// text, which names the one it cannot take.
pub(crate) fn data_plane(
    py: Python<'_>,
    backend: &str,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<DataPlane> {
    let mut given: Vec<(String, String)> = Vec::new();
    if let Some(d) = options {
        for (k, v) in d.iter() {
            let key = k.extract::<String>()?;
            if key == "timeout" {
                return Err(PyTypeError::new_err(
                    "option \"timeout\" is the transfer engine's; a node's timeouts are its settings",
                ));
            }
            let value = match v.extract::<String>() {
                Ok(text) => text,
                Err(_) => v.str()?.to_string(),
            };
            given.push((key, value));
        }
    }
    // Python's verbs node takes the host's first device when none is named.
    #[cfg(feature = "verbs")]
    if backend == "verbs" && !given.iter().any(|(k, _)| k == "device") {
        let device =
            first_device().map_err(|why| crate::errors::raise(py, why, crate::errors::IO))?;
        given.push(("device".to_owned(), device));
    }
    let _ = py;
    // "local" names the same-host plane in a node as in the engine; a
    // node's is pools in shared memory, which the library and the command
    // line call "shm", so a node takes that name too.
    let plane = if backend == "local" { "shm" } else { backend };
    DataPlane::parse(plane, given).map_err(|e| match e {
        PlaneError::UnknownOption { .. } => PyTypeError::new_err(e.to_string()),
        PlaneError::Unknown { .. } => {
            let others = DataPlane::names().iter().filter(|n| **n != "shm");
            let names: Vec<&str> = ["local (or shm)"]
                .into_iter()
                .chain(others.copied())
                .collect();
            PyValueError::new_err(format!(
                "node backend {backend:?} is not in this module (it has: {})",
                names.join(", ")
            ))
        }
        PlaneError::NotBuilt { .. } => {
            PyValueError::new_err(format!("node backend {backend:?}: {e}"))
        }
        _ => PyValueError::new_err(e.to_string()),
    })
}
