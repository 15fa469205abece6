//! The libfabric `Transport`: one RDM endpoint, one registered pool, RMA
//! writes into peers' pools and reads from them, and a progress thread.
//!
//! Threads. The runtime posts writes and reads from its own thread; a
//! progress thread owned by the transport reads the completion queue
//! (sleeping in `fi_cq_sread` where the provider has a wait object). It is
//! needed even when this side only receives (or is only read from):
//! manual-progress providers (`tcp;ofi_rxm`, `shm`) place incoming data,
//! and answer reads, only while the target's queue is driven.
//! The domain is opened `FI_THREAD_SAFE`, so both threads call libfabric
//! directly.
//!
//! Delivery modes. [`DeliveryMode::Complete`] posts every write with
//! `FI_DELIVERY_COMPLETE`: its completion means the bytes are at the
//! target. [`DeliveryMode::Notify`] posts every chunk with remote CQ data that
//! the receiver counts ([`crate::notice`]); its
//! [`Transport::poll_landed`] reports each write whose count is complete.
//! Reads are posted the same way in both modes, with neither: a read's
//! completion means its bytes are in this process, and it gives the peer
//! no notice to count.
//!
//! Modules: opening (`open`: the configuration, the provider's choice, the
//! objects and the progress thread), writes and reads going out (`post`:
//! checked, split and queued), the writes and reads in flight (`book`),
//! the progress thread (`progress`), the table of peers (`peers`) and the
//! endpoint's reset (`reset`); this module holds the transport and
//! tensorferry-core's `Transport` over it.
#![allow(unsafe_code)]

mod book;
mod open;
mod peers;
mod post;
mod progress;
mod reset;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, Landed, PoolOwner, ReadOp, Region, Regions, Transport,
    WriteOp,
};
use tensorferry_fabric_sys as sys;
use tensorferry_hostmem::HostPool;

use crate::error::FabricError;
use crate::notice::NoticeFormat;
use crate::ofi::{Av, Domain, Endpoint, Info, MemoryRegion};
use crate::provider::DeliveryMode;
use crate::session::{RemoteRegion, Session};
use peers::Peer;
use progress::{stall, Shared, Stall};

pub(crate) use open::{find, probe};
pub use open::{FabricConfig, Opened};

/// How often late writes and reads are looked for.
const SWEEP: Duration = Duration::from_millis(5);

/// How long a cancel over a provider that cannot be reset waits for the
/// operations the provider has done already to be reported (the caller's
/// thread waits: a node's progress thread, which makes no other progress
/// meanwhile).
const SETTLE: Duration = Duration::from_secs(1);

/// A libfabric data plane.
pub struct FabricTransport {
    // Field order is drop order: the regions close before the endpoint
    // (in `shared`, with the operation contexts it may still use, and its
    // queue), and all before the domain and the pool.
    regions: Regions<MemoryRegion>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// The endpoint's address, as the session id names it (a reset
    /// reopens the endpoint at it).
    endpoint_name: Vec<u8>,
    av: Arc<Av>,
    domain: Arc<Domain>,
    pool: Option<HostPool>,
    peers: HashMap<String, Peer>,
    opened: Opened,
    session: String,
    notice_format: NoticeFormat,
    cq_data_size: usize,
    write_timeout: Duration,
    /// The stuck progress thread was reported.
    stuck_reported: bool,
    /// When a reset last failed (it is not tried again for a while).
    reset_failed: Option<Instant>,
    /// Entries of the completion queue (a reset opens a new one).
    cq_size: usize,
    /// When `poll_completion` next looks for late writes and reads.
    next_sweep: Instant,
    /// What the endpoint was opened from (a reset opens it again).
    info: Info,
}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("opened", &self.opened)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}
impl FabricTransport {
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

    /// What was opened.
    pub fn opened(&self) -> &Opened {
        &self.opened
    }

    /// Stops (`true`) or resumes the progress thread, as a stalled process
    /// would: this side then neither places incoming data (on
    /// manual-progress providers) nor reports completions. Tests use it to
    /// show what each completion level guarantees.
    pub fn hold_progress(&self, hold: bool) {
        self.shared.lock().held = hold;
        self.shared.cq().signal();
    }

    /// The session id over the regions registered now.
    fn session_text(&self) -> String {
        Session {
            provider: self.opened.provider.clone(),
            addr: self.endpoint_name.clone(),
            regions: self
                .regions
                .iter()
                .map(|(r, mr)| RemoteRegion {
                    key: mr.key(),
                    base: r.addr,
                    len: r.len,
                })
                .collect(),
            notify: self.opened.delivery == DeliveryMode::Notify,
            virt_addr: self.opened.mr.virt_addr,
            wide_data: self.cq_data_size >= 8,
        }
        .encode()
    }

    /// The endpoint, where the provider binds regions to it
    /// (`FI_MR_ENDPOINT`); `None` elsewhere.
    fn endpoint_for_regions(&self) -> Result<Option<Arc<Endpoint>>, FabricError> {
        if !self.opened.mr.endpoint {
            return Ok(None);
        }
        self.shared
            .endpoint
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .map(Some)
            .ok_or_else(|| FabricError::Unsupported {
                provider: self.opened.provider.clone(),
                what: "has no endpoint open (a reset failed to open it again)".into(),
            })
    }

    /// Ends, by resetting the endpoint, the operations given up that still
    /// have chunks posted (the provider did not end them by itself); a
    /// failed reset is retried after [`reset::RETRY`], their memory held
    /// meanwhile.
    fn end_given_up(&mut self, why: &'static str) -> Result<(), FabricError> {
        if !self.shared.lock().ended_in_flight() {
            return Ok(());
        }
        if self
            .reset_failed
            .is_some_and(|at| at.elapsed() < reset::RETRY)
        {
            return Ok(());
        }
        match self.reset(why) {
            Ok(()) => {
                self.reset_failed = None;
                Ok(())
            }
            Err(e) => {
                self.reset_failed = Some(Instant::now());
                Err(e)
            }
        }
    }
}

// SAFETY: the pool is a `HostPool` the transport owns as a field (set by
// `with_pool`, never taken out): mapped at creation, the same range for its
// life, unmapped when the transport drops (after its registration, as its
// fields drop in order); moving the transport does not move the mapping.
// Without a pool the range is empty, which a node refuses.
#[allow(unsafe_code)]
unsafe impl PoolOwner for FabricTransport {
    fn pool_ptr(&self) -> *mut u8 {
        FabricTransport::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        FabricTransport::pool_len(self)
    }
}

impl Transport for FabricTransport {
    type Error = FabricError;

    fn fault_kind(error: &FabricError) -> FaultKind {
        error.kind()
    }

    fn session_id(&self) -> &str {
        &self.session
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_write: self
                .opened
                .chunk
                .saturating_mul(self.notice_format.max_chunks()),
            delivery_complete: self.opened.delivery == DeliveryMode::Complete,
            // Reported failed at the write timeout, and ended (the
            // endpoint reset under it where the provider does not end it)
            // at the next poll: within a sweep, and the reset's own time.
            write_lifetime: self.write_timeout.saturating_add(reset::GRACE),
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, FabricError> {
        self.regions.check_room()?;
        let ep = self.endpoint_for_regions()?;
        let ep = ep.as_ref();
        // A random key (see `MrPolicy::requested_key`); one the domain
        // holds already is refused, and another drawn.
        let mut tries = 0;
        let mr = loop {
            let key = self
                .opened
                .mr
                .requested_key()
                .map_err(|source| FabricError::Os {
                    what: "draw a memory key",
                    source,
                })?;
            // SAFETY: the caller's contract: the memory stays mapped until
            // deregistered or the transport dropped (the regions are
            // dropped first of all fields).
            match unsafe {
                MemoryRegion::register(&self.domain, ep, addr, len, key, self.opened.reads)
            } {
                Err(FabricError::Call { errno, .. })
                    if errno == sys::FI_ENOKEY as i32 && key != 0 && tries < 8 =>
                {
                    tries += 1;
                }
                other => break other?,
            }
        };
        let region = self.regions.insert(addr as u64, len as u64, mr)?;
        // Peers address every region through the session id, so it lists
        // them all; a peer must be given the new one.
        self.session = self.session_text();
        Ok(region)
    }

    /// Ends a registration once nothing moves through it any more: its
    /// chunks still queued fail at once, those posted are waited for (at
    /// most the write timeout, by which their operations have expired),
    /// and those still posted then are ended with every other operation of
    /// their peers, by resetting the endpoint. Where even that cannot be
    /// done, it fails with `NotEnded` and the region stays registered: its
    /// memory must stay mapped. Then its key is closed, and peers'
    /// operations that reach the provider afterwards are refused. Over
    /// `tcp` the provider places a peer's write whose first bytes came
    /// before to its end, key closed or not: there the endpoint is reset
    /// once more, which ends every connection and what was under way on
    /// it (peers' operations into this process's other regions, too, fail
    /// as a broken connection does), so that no byte lands in the memory
    /// after the return.
    fn deregister(&mut self, region: Region) -> Result<(), FabricError> {
        self.regions.get(region.id)?;
        self.shared
            .fail_backlog(region.id, "its local region was deregistered");
        let start = Instant::now();
        loop {
            let (posted, peers) = self.shared.lock().posted_from(region.id);
            if posted == 0 {
                break;
            }
            let waited = start.elapsed();
            if waited >= self.write_timeout {
                {
                    let mut book = self.shared.lock();
                    for p in &peers {
                        book.cancel(p);
                    }
                }
                self.reset("operations of a region being deregistered did not end")?;
                let (left, _) = self.shared.lock().posted_from(region.id);
                if left > 0 {
                    return Err(FabricError::NotEnded {
                        peer: peers
                            .iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        ops: left,
                        waited,
                        why: "the endpoint was reset, yet chunks of the region are still posted",
                    });
                }
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let software = reset::places_in_software(&self.opened.provider);
        if software && !reset::resettable(&self.opened.provider) {
            return Err(FabricError::NotEnded {
                peer: "any peer".into(),
                ops: 0,
                waited: start.elapsed(),
                why: "this provider places peers' writes in software and cannot be reset, so one under way into the region could not be ended",
            });
        }
        // Closing the key first: from here on a peer's write into the
        // region is refused as it arrives; the reset then ends one the
        // provider was already placing.
        drop(self.regions.remove(region)?);
        self.session = self.session_text();
        if software {
            self.reset(reset::DEREGISTERED)?;
        }
        Ok(())
    }

    /// Reads `read.len` bytes of the peer's registered memory into
    /// `read.region`, split at the chunk size as writes are, with the
    /// write timeout and [`cancel_transfers`](Transport::cancel_transfers)
    /// ending it as they end writes. Refused where the provider offers no
    /// reads ([`Opened::reads`]).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), FabricError> {
        self.queue_read(read)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), FabricError> {
        self.queue_write(write)
    }

    fn poll_completion(&mut self) -> Option<Completion<FabricError>> {
        {
            let mut book = self.shared.lock();
            // Deadlines are kept here, on the caller's thread, not by the
            // progress thread: a provider call there can hang (libfabric
            // 1.17's shm spins forever on the lock of a peer that died
            // holding it), and late writes and reads must still be ended
            // (their queued chunks dropped, their peer's connection
            // closed) in time; each is reported once the provider has
            // ended it.
            let now = Instant::now();
            if now >= self.next_sweep {
                self.next_sweep = now + SWEEP;
                let expired = book.expire(now, self.write_timeout);
                let beat = Duration::from_millis(self.shared.beat.load(Ordering::Relaxed));
                let silent = self.shared.born.elapsed().saturating_sub(beat);
                let provider = &self.opened.provider;
                let silent_ms = silent.as_millis() as u64;
                match stall(
                    silent,
                    self.write_timeout,
                    book.held,
                    expired,
                    self.stuck_reported,
                ) {
                    Stall::Failing => {
                        self.stuck_reported = true;
                        tracing::error!(
                            %provider,
                            expired,
                            silent_ms,
                            "writes timed out while the progress thread was inside one provider call; they are reported once the provider ends them, and their memory stays held until then"
                        );
                    }
                    Stall::Long => {
                        tracing::debug!(%provider, silent_ms, "the progress thread is inside a long provider call");
                    }
                    Stall::Back => {
                        self.stuck_reported = false;
                        tracing::info!(%provider, "the progress thread is back from the provider");
                    }
                    Stall::None => {}
                }
            }
            if let Some(c) = book.done.pop_front() {
                drop(book);
                self.evict_dead();
                return Some(c);
            }
        }
        // Operations given up whose chunks the provider still has: ended
        // by a reset, reported once that is done (their memory held until
        // then).
        if let Err(e) = self.end_given_up("writes or reads past their deadline") {
            tracing::error!(error = %e, "late writes or reads could not be ended; their memory stays in use");
        }
        self.evict_dead();
        // Clear first, then look again: news that comes after the look
        // signals the descriptor anew.
        self.shared.wake.clear();
        self.shared.lock().done.pop_front()
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        if self.opened.delivery != DeliveryMode::Notify {
            return None;
        }
        self.shared.lock().notices.pop_landed()
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.shared.wake.fd())
    }

    /// Ends the writes to and reads from the peer: their chunks still
    /// queued are dropped, and those the provider has are ended by
    /// resetting the endpoint (which ends every operation posted through
    /// it: those of other peers are posted again, or, where receivers
    /// count remote CQ data, fail with a retryable error). When it
    /// returns `Ok`, none of them moves a byte any more and each one's
    /// completion is queued. Where the provider cannot be reset (`shm`),
    /// those it has done are waited for (up to a second) and the ones a
    /// peer has taken and not ended are `NotEnded`, their memory held.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), FabricError> {
        let mine = self.shared.lock().cancel(session);
        self.evict_dead();
        if mine.is_empty() {
            return Ok(());
        }
        let held = |t: &Self| {
            let book = t.shared.lock();
            mine.iter().filter(|&&w| book.holds(w)).count()
        };
        if held(self) == 0 {
            return Ok(());
        }
        let start = Instant::now();
        if !reset::resettable(&self.opened.provider) {
            // No reset here: what the provider has done already (over
            // shm a read is copied inside the call that posts it) is
            // reported by the progress thread in moments, later on a busy
            // host; that is waited for, bounded, before the rest is named.
            while held(self) > 0 && start.elapsed() < SETTLE {
                self.shared.cq().signal();
                std::thread::sleep(Duration::from_micros(200));
            }
            return match held(self) {
                0 => Ok(()),
                left => Err(FabricError::NotEnded {
                    peer: session.to_owned(),
                    ops: left,
                    waited: start.elapsed(),
                    why: reset::CANNOT_END,
                }),
            };
        }
        self.reset("a caller stopped waiting for a peer's writes or reads")?;
        match held(self) {
            0 => Ok(()),
            left => Err(FabricError::NotEnded {
                peer: session.to_owned(),
                ops: left,
                waited: start.elapsed(),
                why: "the endpoint was reset, yet they are still booked",
            }),
        }
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cq().signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Fields drop in order: region, ..., pool last.
    }
}
