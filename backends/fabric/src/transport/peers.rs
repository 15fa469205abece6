//! The peers this transport writes to: each session id resolved once into
//! an address-vector entry, and dropped when its writes fail or time out
//! (which closes the provider's connection to it).

use std::sync::Arc;

use tensorferry_fabric_sys as sys;
use tracing::warn;

use super::FabricTransport;
use crate::error::FabricError;
use crate::session::Session;

/// Peers remembered before the idle ones are forgotten.
const MAX_PEERS: usize = 4096;

/// A peer's pool, resolved once per session id.
pub(super) struct Peer {
    pub(super) fi_addr: sys::fi_addr_t,
    pub(super) session: Session,
    pub(super) name: Arc<str>,
}

impl FabricTransport {
    /// Removes the peers whose writes failed or timed out, so that their
    /// connection closes and the next write reconnects. Only this thread
    /// touches the peer table and the address vector. A peer with an op
    /// still queued or posted keeps its address until they end: the
    /// progress thread posts their chunks by it, and a chunk posted to an
    /// address removed from the vector is undefined in libfabric (1.17's
    /// rxm crashes on it). Only this thread queues chunks, so a peer found
    /// idle here stays idle until it is removed.
    pub(super) fn evict_dead(&mut self) {
        let evict = {
            let mut book = self.shared.lock();
            if book.evict.is_empty() {
                return;
            }
            let all = std::mem::take(&mut book.evict);
            let (idle, busy): (Vec<_>, Vec<_>) = all.into_iter().partition(|p| !book.busy_with(p));
            for p in busy {
                if !book.evict.contains(&p) {
                    book.evict.push(p);
                }
            }
            idle
        };
        for name in evict {
            if let Some(p) = self.peers.remove(&*name) {
                warn!(peer = %name, "peer dropped after a failed write; its connection closes");
                self.av.remove(p.fi_addr);
            }
        }
    }

    /// The peer of `session`, resolved and inserted into the address
    /// vector on first use.
    pub(super) fn peer(&mut self, session: &str) -> Result<&Peer, FabricError> {
        self.evict_dead();
        if !self.peers.contains_key(session) {
            let parsed = Session::parse(session).map_err(|why| FabricError::BadSession {
                session: session.to_owned(),
                why,
            })?;
            if parsed.provider != self.opened.provider {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: format!(
                        "it is a {} session; this transport runs {}",
                        parsed.provider, self.opened.provider
                    ),
                });
            }
            if parsed.regions.is_empty() {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: "the peer registered no memory".into(),
                });
            }
            if parsed.notify && self.cq_data_size < 4 {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: "the peer counts remote CQ data, which this provider cannot send".into(),
                });
            }
            if self.peers.len() >= MAX_PEERS {
                // Sessions of restarted peers pile up otherwise: forget the
                // peers no write is under way to.
                let busy: Vec<Arc<str>> = self
                    .shared
                    .lock()
                    .ops
                    .iter()
                    .flatten()
                    .map(|w| Arc::clone(&w.peer))
                    .collect();
                let idle: Vec<String> = self
                    .peers
                    .keys()
                    .filter(|k| !busy.iter().any(|b| &**b == k.as_str()))
                    .cloned()
                    .collect();
                for k in idle {
                    if let Some(p) = self.peers.remove(&k) {
                        self.av.remove(p.fi_addr);
                    }
                }
            }
            let fi_addr = self.av.insert(&parsed.addr, session)?;
            self.peers.insert(
                session.to_owned(),
                Peer {
                    fi_addr,
                    session: parsed,
                    name: Arc::from(session),
                },
            );
        }
        self.peers
            .get(session)
            .ok_or_else(|| FabricError::BadSession {
                session: session.to_owned(),
                why: "vanished from the peer table".into(),
            })
    }
}
