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
//!
//! An endpoint's key is learnt once, and forgotten only when the
//! connection to it is gone (the receiver reports the endpoint `Gone`): a
//! registration of the same endpoint over another key's connection teaches
//! nothing meanwhile, as tensorferry-core's coordinator takes no such
//! registration while the first member holds the endpoint. An instance
//! restarted with a new key is learnt anew once its predecessor's
//! connection dropped.

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
    /// Moves on whenever a learnt key is forgotten (its endpoint's
    /// connection is gone), so that the sender redoes the connections it
    /// made with it.
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
                tracing::warn!(endpoint, key = %key, holder = %k, "a registration names an endpoint another key holds; not learnt");
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

    /// The connection to `endpoint` is gone: its key is forgotten, and the
    /// next registration of it teaches it anew.
    pub(crate) fn forget(&self, endpoint: &str) {
        if self.map().remove(endpoint).is_some() {
            self.changes.fetch_add(1, Ordering::Release);
        }
    }

    /// How many times a learnt key was forgotten.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::curve::CurveKeyPair;

    #[test]
    fn an_endpoints_key_is_learnt_once_and_forgotten_with_its_connection() {
        let me = CurveKeyPair::generate().unwrap();
        let keys = ServerKeys::new(&CurveConfig {
            key: me,
            peers: Vec::new(),
        });
        let (first, other) = (CurvePublicKey([1; 32]), CurvePublicKey([2; 32]));
        let ep = "tcp://10.0.0.1:5700";
        assert_eq!(keys.of(ep), None);
        keys.learn(ep, first);
        // Another key naming the same endpoint teaches nothing, and the
        // sender's connections stand.
        keys.learn(ep, other);
        assert_eq!(keys.of(ep), Some(first));
        assert_eq!(keys.changes(), 0);
        // Once its connection is gone, the next registration is learnt.
        keys.forget(ep);
        assert_eq!((keys.of(ep), keys.changes()), (None, 1));
        keys.learn(ep, other);
        assert_eq!(keys.of(ep), Some(other));
    }
}
