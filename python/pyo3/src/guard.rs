//! The guard every ferry object of the Python package takes: its
//! keywords (`allow_from`, `curve_key`, `curve_peers`), and for the parts
//! not given (the allow-list; CURVE's key and peers, a pair) the
//! environment's (`FERRY_ALLOW_FROM`, `FERRY_CURVE_KEY`,
//! `FERRY_CURVE_PEERS`), read by tensorferry-zmq's one reader of them; and
//! `Guard`, the same guard for sockets that pyzmq opens (vLLM-omni's
//! connector), whose authentication handler asks it for its verdicts.

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use tensorferry_zmq::GuardConfig;

/// The keywords' names, as errors name them.
const KEYWORDS: [&str; 3] = ["allow_from", "curve_key", "curve_peers"];

/// `allow_from` as given: a comma-separated string, or a sequence of
/// strings (an empty one: any address).
pub(crate) fn addresses(allow_from: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(v) = allow_from.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s
            .to_str()?
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect());
    }
    v.extract::<Vec<String>>().map_err(|_| {
        PyTypeError::new_err("allow_from: a string of comma-separated addresses, or a list of them")
    })
}

/// The guard the keywords name, with the parts they leave unset (the
/// allow-list; CURVE's key and peers) the environment's: a deployment
/// that sets the variables keeps CURVE for an object given only an
/// allow-list.
pub(crate) fn guard(
    allow_from: Vec<String>,
    curve_key: Option<PathBuf>,
    curve_peers: Option<PathBuf>,
) -> PyResult<tensorferry_zmq::Guard> {
    let given = GuardConfig {
        allow_from,
        curve_key,
        curve_peers,
    };
    let (settings, names) = given.or_env(KEYWORDS);
    settings
        .guard(names)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Who may connect to a socket, and with which keys (see
/// `tensorferry/_native.pyi`).
#[pyclass(name = "Guard", module = "tensorferry._native", frozen)]
pub struct PyGuard {
    guard: tensorferry_zmq::Guard,
}

#[pymethods]
impl PyGuard {
    #[new]
    #[pyo3(signature = (*, allow_from = None, curve_key = None, curve_peers = None))]
    fn new(
        allow_from: Option<&Bound<'_, PyAny>>,
        curve_key: Option<PathBuf>,
        curve_peers: Option<PathBuf>,
    ) -> PyResult<Self> {
        Ok(Self {
            guard: guard(addresses(allow_from)?, curve_key, curve_peers)?,
        })
    }

    /// True if it enforces anything (an allow-list, or CURVE).
    #[getter]
    fn enforces(&self) -> bool {
        self.guard.enforces()
    }

    /// The addresses that may connect to `tcp://` sockets (empty: any).
    #[getter]
    fn allow_from(&self) -> Vec<String> {
        self.guard.allow.iter().map(ToString::to_string).collect()
    }

    /// True with CURVE.
    #[getter]
    fn curve(&self) -> bool {
        self.guard.curve.is_some()
    }

    /// This process's public key in Z85 (`None` without CURVE).
    #[getter]
    fn public_key(&self) -> Option<String> {
        self.guard.curve.as_ref().map(|c| c.key.public().to_z85())
    }

    /// This process's secret key in Z85 (`None` without CURVE), for a
    /// socket of another binding to serve or connect with.
    #[getter]
    fn secret_key(&self) -> Option<String> {
        self.guard.curve.as_ref().map(|c| c.key.secret_z85())
    }

    /// The public keys admitted, in Z85.
    #[getter]
    fn peers(&self) -> Vec<String> {
        self.guard
            .curve
            .as_ref()
            .map(|c| c.peers.iter().map(|k| k.to_z85()).collect())
            .unwrap_or_default()
    }

    /// True if `key` (Z85) is admitted.
    fn admits_key(&self, key: &str) -> bool {
        let Ok(key) = tensorferry_zmq::CurvePublicKey::from_z85(key) else {
            return false;
        };
        self.guard.curve.as_ref().is_some_and(|c| c.admits(&key))
    }

    /// The ZAP domain a socket bound on `endpoint` takes (`None`: it is
    /// not put to a handler).
    fn domain(&self, endpoint: &str) -> Option<&'static str> {
        self.guard.domain(endpoint)
    }

    /// The verdict on a connection a ZAP request describes: `(True, user)`
    /// with the User-Id its messages carry, or `(False, why)`.
    fn verdict(
        &self,
        domain: &str,
        address: &str,
        mechanism: &[u8],
        credentials: &[u8],
    ) -> (bool, String) {
        match self.guard.admits(domain, address, mechanism, credentials) {
            Ok(user) => (true, user),
            Err(why) => (false, why.to_owned()),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Guard(allow_from={:?}, curve={}, peers={})",
            self.allow_from(),
            self.curve(),
            self.peers().len()
        )
    }
}
