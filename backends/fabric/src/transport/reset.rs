//! Resetting the endpoint: how the transport ends operations the provider
//! took and does not end by itself.
//!
//! libfabric 1.17's `tcp;ofi_rxm` keeps a peer's connection, and the
//! operations posted on it, when the peer is removed from the address
//! vector, unless `FI_AV_REMOVE_CLEANUP` is on; ferry does not rely on that
//! setting (with it on, 1.17's rxm dereferences a connection that a failed
//! link had closed already, and crashes). Closing the endpoint closes
//! every connection and ends every operation posted through it; nothing
//! of theirs moves afterwards. A new endpoint is then opened at the same
//! address, so that peers reach this transport by the same session id,
//! and the chunks of operations nobody gave up are posted again (a chunk
//! written or read twice leaves the same bytes) or, where the receiver
//! counts each chunk's remote CQ data, failed with a retryable error.
//!
//! The progress thread is stopped at the top of its loop meanwhile, so
//! that no completion is being handled while the contexts of the cut
//! operations are freed. If it does not stop (it is inside a provider call
//! that does not return), nothing is reset: the operations stay booked and
//! their memory in use.
//!
//! Only the providers over rxm are reset: their address is a host and a
//! port, which the new endpoint binds again. libfabric 1.17's `shm`
//! cannot be: a peer that took an operation copies its bytes in its own
//! time, from or into this process's memory, whatever this process does
//! (with cross-memory attach; without it, through shared buffers the peer
//! still reads after a reset), and a peer that mapped this endpoint's
//! region keeps that mapping (a new endpoint under the same name is not
//! seen, and in one process the peer's mapping is this endpoint's own,
//! gone with it). There an operation a live peer has taken ends only when
//! the peer ends it: until then it is not reported, and its memory stays
//! in use (`NotEnded`).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use tensorferry_fabric_sys as sys;
use tracing::warn;

use super::FabricTransport;
use crate::error::FabricError;
use crate::ofi::{Cq, Endpoint};
use crate::provider::DeliveryMode;

/// True if operations of `provider` can be ended by a reset (see the
/// module's documentation).
pub(crate) fn resettable(provider: &str) -> bool {
    provider.ends_with(";ofi_rxm")
}

/// True if `provider` places a peer's one-sided write in software, from
/// its connection, to the write's end once it began: closing the region's
/// key does not stop it; only a reset (closing the connection) does. A
/// NIC's placement checks the key of every packet instead.
pub(crate) fn places_in_software(provider: &str) -> bool {
    provider == "tcp" || provider.starts_with("tcp;")
}

/// Why a deregistration resets the endpoint (see `places_in_software`).
pub(super) const DEREGISTERED: &str =
    "a region was deregistered while a peer's write into it may be under way";

/// Why an operation over a provider that cannot be reset is not ended.
pub(super) const CANNOT_END: &str =
    "this provider cannot end an operation a peer has taken (only those over rxm can be reset)";

/// How long a reset may take, at most: the progress thread's stop, the
/// endpoint's close and its reopening.
pub(super) const GRACE: Duration = Duration::from_secs(1);

/// How long the progress thread is given to stop.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// What a failed reset is retried after, at the earliest.
pub(super) const RETRY: Duration = Duration::from_secs(1);

impl FabricTransport {
    /// Closes the endpoint, ending every operation posted through it, and
    /// opens it again at the same address (see the module's
    /// documentation); `why` says whose operations it ends. `Err`: the
    /// progress thread did not stop, and nothing was reset; or the
    /// endpoint could not be opened again.
    pub(super) fn reset(&mut self, why: &'static str) -> Result<(), FabricError> {
        if !resettable(&self.opened.provider) {
            return Err(self.not_ended(why, Duration::ZERO, CANNOT_END));
        }
        if self.opened.mr.endpoint {
            return Err(self.not_ended(
                why,
                Duration::ZERO,
                "this provider binds regions to the endpoint (FI_MR_ENDPOINT), which a reset would lose",
            ));
        }
        let start = Instant::now();
        let shared = &self.shared;
        shared.paused.store(false, Ordering::Release);
        shared.pause.store(true, Ordering::Release);
        shared.cq().signal();
        while !shared.paused.load(Ordering::Acquire) {
            if start.elapsed() >= STOP_WAIT {
                shared.pause.store(false, Ordering::Release);
                return Err(self.not_ended(
                    why,
                    start.elapsed(),
                    "the progress thread is inside a provider call that does not return",
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let result = self.reopen(why);
        self.shared.pause.store(false, Ordering::Release);
        self.shared.cq().signal();
        if result.is_ok() && why == DEREGISTERED {
            // Every target-side deregistration over tcp: routine.
            tracing::debug!(
                provider = %self.opened.provider,
                took_us = start.elapsed().as_micros() as u64,
                "endpoint reset after a deregistration"
            );
        } else if result.is_ok() {
            warn!(
                provider = %self.opened.provider,
                why,
                took_us = start.elapsed().as_micros() as u64,
                "endpoint reset: every operation posted through it ended"
            );
        }
        result
    }

    /// The error of operations `why` could not end.
    fn not_ended(&self, why: &'static str, waited: Duration, reason: &'static str) -> FabricError {
        let book = self.shared.lock();
        let mut peers: Vec<String> = Vec::new();
        let mut ops = 0;
        for ws in book.ops.iter().flatten().filter(|ws| ws.in_flight > 0) {
            ops += 1;
            if !peers.iter().any(|p| **p == *ws.peer) {
                peers.push(ws.peer.to_string());
            }
        }
        tracing::error!(why, reason, ops, "operations could not be ended");
        FabricError::NotEnded {
            peer: peers.join(", "),
            ops,
            waited,
            why: reason,
        }
    }

    /// With the progress thread stopped: closes the endpoint, collects
    /// what it reported, frees what it did not, and opens it again.
    fn reopen(&mut self, why: &'static str) -> Result<(), FabricError> {
        // Nothing posts meanwhile: the progress thread is stopped, and
        // this thread is the only other one that posts. Regions are not
        // bound to the endpoint, so this is its last reference: dropping
        // it closes it.
        let old = self
            .shared
            .endpoint
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(old);
        let again = self.opened.delivery == DeliveryMode::Complete;
        self.collect_reported(again);
        self.shared
            .lock()
            .cut_posted(again, |op, peer| FabricError::Reset {
                op,
                peer: peer.to_owned(),
                why,
            });
        // A new queue too: 1.17's rxm leaves one whose endpoint closed
        // unusable (the next read crashes inside the provider).
        let cq = Cq::open(&self.domain, self.cq_size)?;
        let reopened = self
            .info
            .at_source(&self.endpoint_name)
            .and_then(|info| Endpoint::open(&self.domain, &info, &cq, &self.av));
        let endpoint = match reopened {
            Ok(ep) => ep,
            Err(e) => {
                warn!(error = %e, "the endpoint cannot be opened at its address again; opening it at a new one (peers must be given the new session id)");
                Endpoint::open(&self.domain, &self.info, &cq, &self.av)?
            }
        };
        *self
            .shared
            .cq
            .write()
            .unwrap_or_else(PoisonError::into_inner) = cq;
        if endpoint.name() != self.endpoint_name.as_slice() {
            self.endpoint_name = endpoint.name().to_vec();
            self.session = self.session_text();
        }
        *self
            .shared
            .endpoint
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(endpoint);
        Ok(())
    }

    /// Reads what the closed endpoint's operations reported, until the
    /// queue is empty: nothing more comes for them. Chunks it reported
    /// failed because it closed (flushed) are cut short as those it did
    /// not report are (see `OpBook::cut_posted`); chunks of ops given up
    /// fail them with their own error.
    fn collect_reported(&self, again: bool) {
        let mut buf = [sys::fi_cq_data_entry::default(); 64];
        let cq = self.shared.cq();
        loop {
            match cq.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => self.shared.handle(&buf[..n]),
                Err(errno) if errno == sys::FI_EAVAIL as i32 => match cq.read_err_of_closed() {
                    Some((e, _)) => {
                        let Some(i) = self.shared.contexts.index(e.op_context) else {
                            continue;
                        };
                        self.shared
                            .lock()
                            .cut_one(i, again, |op, peer| FabricError::Reset {
                                op,
                                peer: peer.to_owned(),
                                why: "the endpoint was reset",
                            });
                    }
                    None => return,
                },
                Err(_) => return,
            }
        }
    }
}
