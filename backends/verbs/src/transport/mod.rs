//! [`VerbsTransport`]: tensorferry-core's `Transport` over RC queue pairs.
//!
//! One device port, one protection domain, one completion queue and one
//! registered pool per transport. The first write to (or read from) a peer
//! session makes a connection through the side channel; writes and reads
//! are split at the port's maximum message and posted within a bounded
//! window on that connection's queue pair; the caller's `poll_completion`
//! reaps the CQ and enforces deadlines.
//!
//! Modules: the configuration (`config`) and the opening of the device
//! port, the side channel and its thread (`open`); this module holds the
//! transport and tensorferry-core's `Transport` over it.

#![allow(unsafe_code)] // Registration: the caller keeps the memory mapped.

mod config;
mod open;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, OpSpan, PoolOwner, ReadOp, Region, Transport, WriteOp,
};
use tensorferry_hostmem::HostPool;
use tensorferry_zmq::{zmq, CurvePublicKey, ZapHandler};

#[cfg(test)]
use crate::conn::Requester;
use crate::conn::{ConnBook, ConnState, FLUSH_WAIT};
use crate::device::{Device, PortInfo, RdmaOp};
use crate::error::VerbsError;
use crate::ibv::IbvDevice;
use crate::session::Session;
use crate::side::{self, ServerKeys};
use crate::wake::WakeSet;
pub use config::VerbsConfig;

/// How often the caller's poll checks write and connect deadlines.
const SWEEP: Duration = Duration::from_millis(5);

/// How long a caller waiting for queue pairs to end sleeps between polls
/// (with the book unlocked, so that the side channel goes on).
const END_POLL: Duration = Duration::from_micros(50);

/// ferry's ibverbs transport (see the module documentation).
pub struct VerbsTransport<D: Device = IbvDevice> {
    session: String,
    endpoint: String,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    wake: Mutex<zmq::Socket>,
    events: Arc<WakeSet>,
    book: Arc<Mutex<ConnBook<D>>>,
    next_sweep: Instant,
    /// How long a posted write may still land: failed at the write
    /// timeout, its queue pair flushed or destroyed within
    /// `conn::FLUSH_WAIT`.
    write_lifetime: Duration,
    /// The side channel key of each endpoint this transport connects to,
    /// from the session ids it writes to (read by the side channel's
    /// thread when it connects).
    server_keys: Arc<ServerKeys>,
    /// The side channel's public key, if it is a CURVE server.
    key: Option<CurvePublicKey>,
    /// The side channel's guard, shared with its thread (which drops its
    /// socket first, and is joined before this is dropped).
    zap: Option<Arc<ZapHandler>>,
    // Last: unmapped after the registration (inside the book) is gone.
    pool: Option<HostPool>,
}

impl<D: Device> std::fmt::Debug for VerbsTransport<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl<D: Device> VerbsTransport<D> {
    fn book(&self) -> MutexGuard<'_, ConnBook<D>> {
        side::lock(&self.book)
    }

    /// A region came or went: the session id's generation moves on, so
    /// that writers connect again and learn the regions anew.
    fn regions_changed(&mut self) {
        let session = {
            let mut book = self.book();
            let session = Session {
                incarnation: book.incarnation,
                generation: book.generation.wrapping_add(1),
                endpoint: self.endpoint.clone(),
                key: self.key,
            };
            book.generation = session.generation;
            book.me = session.to_string();
            book.me.clone()
        };
        self.session = session;
    }

    fn wake_side(&self) {
        let s = self
            .wake
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A full pipe already holds a wake-up.
        let _ = s.send(&b"w"[..], zmq::DONTWAIT);
    }

    /// The pool's first byte (null without a pool).
    ///
    /// The pool stays mapped, at this address, for as long as the
    /// transport lives and is released only by its drop: ferry's runtime
    /// relies on it (its [`PoolOwner`] promise), so no method may unmap
    /// or replace it.
    pub fn pool_ptr(&self) -> *mut u8 {
        HostPool::ptr_of(self.pool.as_ref())
    }

    /// The pool's length (0 without a pool).
    pub fn pool_len(&self) -> usize {
        HostPool::len_of(self.pool.as_ref())
    }

    /// The side channel's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Connections to the side channel its guard refused so far (by
    /// address or CURVE key; a connection without CURVE to a CURVE side
    /// channel is refused by libzmq before the guard sees it).
    pub fn refused(&self) -> u64 {
        self.zap.as_ref().map_or(0, |z| z.refused())
    }

    /// Connection requests the side channel refused because they named a
    /// writer session whose CURVE key is not the one their connection
    /// authenticated with (a peer admitted under its own key asking in
    /// another writer's name).
    pub fn forged_requests(&self) -> u64 {
        self.book().forged_requests()
    }

    /// Queue pairs this transport accepted from writers and keeps.
    pub fn accepted(&self) -> usize {
        self.book().accepted()
    }

    /// Queue pairs accepted from `who` and kept.
    #[cfg(test)]
    pub(crate) fn accepted_from(&self, who: &Requester) -> usize {
        self.book().accepted_from(who)
    }

    /// The opened port.
    pub fn port(&self) -> PortInfo {
        self.book().device.port().clone()
    }

    /// The local GID index and GID in use.
    pub fn gid(&self) -> (u8, [u8; 16]) {
        self.book().gid
    }

    /// The state of the connection to `peer`, if there is one.
    pub fn connection(&self, peer: &str) -> Option<ConnState> {
        self.book().state_of(peer)
    }

    /// Waits until no connection to `peer` (to anyone, for `None`) is
    /// ending: every work request its queue pair held has completed, and
    /// its transfers' completions are queued. Past [`FLUSH_WAIT`] the ones
    /// left go by the last resort (their queue pairs destroyed).
    fn wait_ended(&self, peer: Option<&str>) {
        let deadline = Instant::now() + FLUSH_WAIT;
        loop {
            {
                let mut book = self.book();
                book.progress_ends();
                if !book.ending(peer) {
                    break;
                }
                if Instant::now() >= deadline {
                    book.abandon_ending(peer);
                    break;
                }
            }
            std::thread::sleep(END_POLL);
        }
        // Completions are queued: a caller waiting on the wake descriptor
        // looks.
        self.events.signal();
    }

    /// Queues a write or read of `span`: its local bytes (checked here) to
    /// or from its address at the peer.
    fn post(&mut self, op: RdmaOp, span: OpSpan<'_>) -> Result<(), VerbsError> {
        let fresh = {
            let mut book = self.book();
            // A write's source and a read's destination: the same bounds.
            let (&local, &keys) = book
                .regions
                .source(span.region, span.local_offset, span.len)?;
            let local = (local.addr + span.local_offset, keys.lkey);
            let fresh = book.post(
                op,
                span.peer,
                local,
                span.len,
                span.remote_addr,
                span.cookie,
            )?;
            if fresh {
                // Under the book's lock, so that the side channel's thread,
                // which starts the connection under it, finds the key.
                self.server_keys.note(span.peer);
            }
            fresh
        };
        if fresh {
            self.wake_side();
        }
        Ok(())
    }

    /// Runs `f` on the device (tests drive their stand-in through this).
    pub fn with_device_mut<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.book().device)
    }
}

// SAFETY: the pool, when there is one, is a `HostPool` the transport owns
// as a field (set by `with_pool` or `with_device_and_pool`, never taken
// out): mapped at creation, the same range for its life, unmapped when
// the transport drops; moving the transport does not move the mapping.
// Without a pool the range is empty, which a node refuses.
#[allow(unsafe_code)]
unsafe impl<D: Device> PoolOwner for VerbsTransport<D> {
    fn pool_ptr(&self) -> *mut u8 {
        VerbsTransport::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        VerbsTransport::pool_len(self)
    }
}

impl<D: Device> Drop for VerbsTransport<D> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake_side();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<D: Device> Transport for VerbsTransport<D> {
    type Error = VerbsError;

    fn fault_kind(error: &VerbsError) -> FaultKind {
        error.kind()
    }

    fn session_id(&self) -> &str {
        &self.session
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Writes are split at the port's maximum message.
            max_write: u64::MAX,
            // An RC write completes when the target's NIC has acknowledged
            // it; the target reads only after the commit, a control message
            // sent after that completion (the ordering Mooncake and sglang
            // rely on too).
            delivery_complete: true,
            write_lifetime: self.write_lifetime,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, VerbsError> {
        let mut book = self.book();
        book.regions.check_room()?;
        // SAFETY: the caller's contract: the memory stays mapped until
        // deregistered or the transport dropped.
        let keys = unsafe { book.device.register(addr as u64, len) }.map_err(VerbsError::from)?;
        let region = match book.regions.insert(addr as u64, len as u64, keys) {
            Ok(r) => r,
            Err(e) => {
                book.device.deregister(keys);
                return Err(e.into());
            }
        };
        drop(book);
        self.regions_changed();
        Ok(region)
    }

    fn deregister(&mut self, region: Region) -> Result<(), VerbsError> {
        let mut book = self.book();
        book.regions.get(region.id)?;
        // Posted work may name the region: its connections end (and
        // reconnect on next use) before the registration goes.
        book.end_all("a registered region was deregistered");
        drop(book);
        self.wait_ended(None);
        let mut book = self.book();
        // Only this caller (`&mut self`) changes the regions.
        let keys = book.regions.remove(region)?;
        book.device.deregister(keys);
        drop(book);
        self.regions_changed();
        Ok(())
    }

    /// Posts an RDMA READ on the connection to `src_session` (made on
    /// first use, as a write's is): chunked, windowed, timed out (by the
    /// write timeout), failed and cancelled as writes are, on the same
    /// queue pair. The local region is checked here; the source against
    /// the regions the peer listed (at once when they are known, when the
    /// first chunk goes otherwise).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), VerbsError> {
        self.post(RdmaOp::Read, read.span())
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), VerbsError> {
        self.post(RdmaOp::Write, write.span())
    }

    fn poll_completion(&mut self) -> Option<Completion<VerbsError>> {
        // Cleared before looking, so news that comes after signals anew.
        self.events.clear();
        let mut book = side::lock(&self.book);
        if let Some(c) = book.poll() {
            return Some(c);
        }
        // Nothing finished: the caller is about to wait, so this is when
        // the clock is read (not once per completion) and deadlines kept.
        let now = Instant::now();
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP;
            if let Some(c) = book.sweep(now) {
                return Some(c);
            }
        }
        if book.needs_polling() {
            self.events.signal();
        }
        None
    }

    /// Stops the queue pair to the peer (ERR), drops its writes and reads
    /// not yet posted, and waits until the marker posted after the ERR
    /// completes: every work request before it has then completed, flushed
    /// or done, so none moves a byte any more (a flushed READ places
    /// nothing). Transfers that finished complete as they did; the others
    /// as [`VerbsError::Cancelled`]. A queue pair whose marker does not
    /// come within a second is destroyed instead. The next transfer with
    /// the peer connects anew.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), VerbsError> {
        self.book().cancel(session);
        self.wait_ended(Some(session));
        Ok(())
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.events.fd())
    }
}
