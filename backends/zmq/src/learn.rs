//! The CURVE server key of each endpoint a channel sends to.
//!
//! A CURVE client must know its server's public key before it connects.
//! An instance sends only to its coordinator, whose key is the one it
//! admits. A coordinator sends to the work endpoints instances registered:
//! each registration arrives over a connection whose client key the
//! handler checked and named (ZAP's User-Id), so the endpoint it names is
//! bound to that key, and the coordinator connects to it expecting it. An
//! instance serves its work endpoint with the key it registers with, so
//! nothing about keys travels in the messages themselves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::curve::{CurveConfig, CurvePublicKey};

/// Endpoints whose keys are remembered at most (a coordinator's members
/// are at most `Limits::members`, 1,024 by default); past it, registrations
/// of endpoints not yet known teach nothing (and are logged).
const MAX_LEARNT: usize = 8192;

/// Server keys by endpoint, shared by a channel's two sides.
#[derive(Debug)]
pub(crate) struct ServerKeys {
    learnt: Mutex<HashMap<String, CurvePublicKey>>,
    /// Moves on whenever a learnt key replaces another (a peer restarted
    /// with a new key at the same endpoint), so that the sender redoes the
    /// connections it made with the old one.
    changes: AtomicU64,
    /// The one admitted key, if there is exactly one: an instance's
    /// coordinator.
    sole: Option<CurvePublicKey>,
}

impl ServerKeys {
    pub(crate) fn new(config: &CurveConfig) -> Self {
        Self {
            learnt: Mutex::new(HashMap::new()),
            changes: AtomicU64::new(0),
            sole: match config.peers.as_slice() {
                [one] => Some(*one),
                _ => None,
            },
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, CurvePublicKey>> {
        self.learnt
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The key the server at `endpoint` must hold.
    pub(crate) fn of(&self, endpoint: &str) -> Option<CurvePublicKey> {
        self.map().get(endpoint).copied().or(self.sole)
    }

    /// `endpoint` registered over a connection authenticated as `key`.
    pub(crate) fn learn(&self, endpoint: &str, key: CurvePublicKey) {
        let mut map = self.map();
        let full = map.len() >= MAX_LEARNT;
        match map.get_mut(endpoint) {
            Some(k) if *k == key => {}
            Some(k) => {
                tracing::info!(endpoint, key = %key, was = %k, "a registration names its endpoint with a new CURVE key");
                *k = key;
                self.changes.fetch_add(1, Ordering::Release);
            }
            None if full => {
                tracing::warn!(
                    endpoint,
                    "too many endpoints to remember the CURVE key of; registration not learnt"
                );
            }
            None => {
                map.insert(endpoint.to_owned(), key);
            }
        }
    }

    /// How many times a learnt key was replaced.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}
