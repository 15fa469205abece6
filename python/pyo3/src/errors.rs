//! ferry's Python exceptions: every error a call raises is a subclass of
//! `tensorferry.FerryError` chosen by its kind (`tensorferry/_errors.py` defines the
//! classes, so that both extension modules raise the same ones).
//!
//! The kinds are the core's fault kinds ([`FaultKind::ALL`], with their
//! names and the codes sglang's `transfer_sync` returns), followed by the
//! kinds of the calls around the data plane ([`NODE_KINDS`]: a node's
//! refusals, a closed engine or node). The module exports both
//! tables (`FAULT_CODES`, `ERROR_KINDS`); the Python package builds its
//! codes from them and its tests check its classes against them.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensorferry::runtime::NodeError;
use tensorferry_core::handshake::instance::InstanceError;
use tensorferry_core::slots::BuddyError;
use tensorferry_core::transport::FaultKind;

/// What kind of failure a Python exception reports (`FerryError.kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A data plane's kind of failure (the core's table).
    Fault(FaultKind),
    /// The coordinator refused the instance's registration.
    Refused,
    /// The instance drains or has left: it takes no new request.
    Draining,
    /// The engine, node, staging or delivery is closed or used up.
    Closed,
    /// The pool or the request table has no room now (try again later).
    NoRoom,
}

/// The kinds beside the core's fault kinds: a node's (refused, draining,
/// no room) and any closed object's (an engine's too).
pub(crate) const NODE_KINDS: [Kind; 4] =
    [Kind::Refused, Kind::Draining, Kind::Closed, Kind::NoRoom];

impl Kind {
    /// An i/o error (the core's catch-all).
    pub(crate) const IO: Kind = Kind::Fault(FaultKind::Io);

    /// Its name, as `FerryError.kind` carries it.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::Fault(k) => k.as_name(),
            Kind::Refused => "refused",
            Kind::Draining => "draining",
            Kind::Closed => "closed",
            Kind::NoRoom => "no_room",
        }
    }

    /// The kind of a node's error.
    pub(crate) fn of_node(e: &NodeError) -> Kind {
        match e {
            NodeError::Refused { .. } => Kind::Refused,
            NodeError::NotRegistered(_) | NodeError::Timeout { .. } => {
                Kind::Fault(FaultKind::Timeout)
            }
            NodeError::Instance(i) => match i {
                InstanceError::Draining => Kind::Draining,
                InstanceError::TableFull | InstanceError::Pool(BuddyError::OutOfSpace { .. }) => {
                    Kind::NoRoom
                }
                InstanceError::TooLarge | InstanceError::Pool(BuddyError::TooLarge { .. }) => {
                    Kind::Fault(FaultKind::TooLarge)
                }
                _ => Kind::IO,
            },
            NodeError::Send { kind, .. } | NodeError::Transport { kind, .. } => Kind::Fault(*kind),
            NodeError::Stopped => Kind::Closed,
            _ => Kind::IO,
        }
    }
}

/// The Python exception for a ferry error: the `tensorferry.FerryError`
/// subclass of `kind`, made by `tensorferry._errors.error_for(message, kind)`.
/// Should the Python package be unimportable, a `RuntimeError`.
pub(crate) fn raise(py: Python<'_>, message: String, kind: Kind) -> PyErr {
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
    raise(py, e.to_string(), Kind::of_node(e))
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
        .map(Kind::Fault)
        .chain(NODE_KINDS)
        .map(Kind::name)
        .collect::<Vec<_>>();
    m.add("ERROR_KINDS", PyTuple::new(py, names)?)?;
    Ok(())
}
