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
//! objects and the progress thread), the writes and reads in flight
//! (`book`), the progress thread (`progress`) and the table of peers
//! (`peers`); this module holds the transport and tensorferry-core's
//! `Transport` over it.
#![allow(unsafe_code)]

mod book;
mod open;
mod peers;
mod progress;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Capabilities, Completion, Landed, ReadOp, Region, RegionError, Transport, WriteOp,
};
use tensorferry_fabric_sys as sys;
use tensorferry_hostmem::HostPool;

use crate::error::{FabricError, OpKind};
use crate::mr::MrPolicy;
use crate::notice::NoticeFormat;
use crate::ofi::{Av, Domain, Endpoint, Info, MemoryRegion};
use crate::provider::DeliveryMode;
use crate::session::{RemoteRegion, Session, MAX_REGIONS};
use book::{Chunk, OpState};
use peers::Peer;
use progress::{stall, Shared, Stall};

pub(crate) use open::{find, probe};
pub use open::{FabricConfig, Opened};

/// How often late writes and reads are looked for.
const SWEEP: Duration = Duration::from_millis(5);

/// A libfabric data plane.
pub struct FabricTransport {
    // Field order is drop order: the regions close before the endpoint,
    // the endpoint before the operation contexts it may still use (in
    // `shared`) and before its queue, and all before the domain and the
    // pool.
    regions: Vec<(Region, MemoryRegion)>,
    next_region: u32,
    thread: Option<JoinHandle<()>>,
    endpoint: Arc<Endpoint>,
    shared: Arc<Shared>,
    av: Arc<Av>,
    domain: Arc<Domain>,
    pool: Option<HostPool>,
    peers: HashMap<String, Peer>,
    opened: Opened,
    session: String,
    notice_format: NoticeFormat,
    cq_data_size: usize,
    next_key: u64,
    write_timeout: Duration,
    /// The stuck progress thread was reported.
    stuck_reported: bool,
    /// When `poll_completion` next looks for late writes and reads.
    next_sweep: Instant,
    _info: Info,
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
    /// relies on it (`tensorferry::runtime::PoolOwner`), so no method may unmap
    /// or replace it.
    pub fn pool_ptr(&self) -> *mut u8 {
        self.pool
            .as_ref()
            .map_or(std::ptr::null_mut(), HostPool::ptr)
    }

    /// The pool's length (0 without a pool).
    pub fn pool_len(&self) -> usize {
        self.pool.as_ref().map_or(0, HostPool::len)
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
        self.shared.cq.signal();
    }

    /// The session id over the regions registered now.
    fn session_text(&self) -> String {
        Session {
            provider: self.opened.provider.clone(),
            addr: self.endpoint.name().to_vec(),
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

    /// The registered region `region` names, and its descriptor.
    fn local_region(&self, region: Region) -> Result<(Region, *mut std::ffi::c_void), FabricError> {
        match self.regions.iter().find(|(r, _)| r.id == region.id) {
            Some((r, mr)) => Ok((*r, mr.desc())),
            None => Err(RegionError::Unknown(region.id).into()),
        }
    }

    /// Books `op` and queues its `chunks` chunks (`chunk(slot, i)` makes
    /// the `i`th), then posts what the provider takes now; the rest goes
    /// out from the progress thread as the queue drains.
    fn queue(&self, op: OpState, chunks: u64, chunk: impl Fn(u32, u64) -> Chunk) {
        let mut book = self.shared.lock();
        let w = match book.free_ops.pop() {
            Some(w) => {
                book.ops[w as usize] = Some(op);
                w
            }
            None => {
                book.ops.push(Some(op));
                (book.ops.len() - 1) as u32
            }
        };
        for i in 0..chunks {
            book.backlog.push_back(chunk(w, i));
        }
        drop(book);
        if self.shared.drain(&self.endpoint) {
            // Wake the progress thread in case it sleeps.
            self.shared.cq.signal();
        }
    }
}

impl Transport for FabricTransport {
    type Error = FabricError;

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
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, FabricError> {
        if self.regions.len() >= MAX_REGIONS {
            return Err(RegionError::TooMany { max: MAX_REGIONS }.into());
        }
        let key = self.opened.mr.requested_key(self.next_key);
        self.next_key += 1;
        let ep = self.opened.mr.endpoint.then_some(&self.endpoint);
        // SAFETY: the caller's contract: the memory stays mapped until
        // deregistered or the transport dropped (the regions are dropped
        // first of all fields).
        let mr =
            unsafe { MemoryRegion::register(&self.domain, ep, addr, len, key, self.opened.reads)? };
        let region = Region {
            id: self.next_region,
            addr: addr as u64,
            len: len as u64,
        };
        self.next_region += 1;
        self.regions.push((region, mr));
        // Peers address every region through the session id, so it lists
        // them all; a peer must be given the new one.
        self.session = self.session_text();
        Ok(region)
    }

    fn deregister(&mut self, region: Region) -> Result<(), FabricError> {
        let i = self
            .regions
            .iter()
            .position(|(r, _)| r.id == region.id)
            .ok_or(RegionError::Unknown(region.id))?;
        self.shared
            .fail_backlog(region.id, "its local region was deregistered");
        self.regions.remove(i);
        self.session = self.session_text();
        Ok(())
    }

    /// Reads `read.len` bytes of the peer's registered memory into
    /// `read.region`, split at the chunk size as writes are, with the
    /// write timeout and [`cancel_transfers`](Transport::cancel_transfers)
    /// ending it as they end writes. Refused where the provider offers no
    /// reads ([`Opened::reads`]).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), FabricError> {
        let ReadOp {
            region,
            local_offset,
            len,
            src_session,
            src_addr,
            cookie,
        } = *read;
        if !self.opened.reads {
            return Err(FabricError::Unsupported {
                provider: self.opened.provider.clone(),
                what: format!(
                    "offers no one-sided reads (FI_READ, FI_REMOTE_READ): cannot read from {src_session}; writes work"
                ),
            });
        }
        let (r, desc) = self.local_region(region)?;
        r.check_source(local_offset, len)?;
        let chunk = self.opened.chunk;
        let peer = self.peer(src_session)?;
        let s = &peer.session;
        let Some(src) = s.region_for(src_addr, len) else {
            return Err(FabricError::ReadSourceOutOfBounds {
                peer: src_session.to_owned(),
                addr: src_addr,
                len,
                regions: s.regions.len(),
            });
        };
        let chunks = len.div_ceil(chunk).max(1);
        let (fi_addr, key, virt, base) = (peer.fi_addr, src.key, s.virt_addr, src.base);
        let name = Arc::clone(&peer.name);
        // A read's completion means its bytes are here at any completion
        // level. FI_DELIVERY_COMPLETE, a level for what is sent, is not
        // asked: shm would then have the peer copy into this process in
        // its own time instead of reading within the call. No remote CQ
        // data: a read gives the peer nothing to count.
        let flags = u64::from(sys::FI_COMPLETION);
        let now = Instant::now();
        let op = OpState {
            kind: OpKind::Read,
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer: name,
            posted: now,
            deadline: now + self.write_timeout,
            ended: false,
            reported: false,
        };
        self.queue(op, chunks, |w, i| {
            let off = i * chunk;
            Chunk {
                op: w,
                kind: OpKind::Read,
                region: r.id,
                local: (r.addr + local_offset + off) as usize,
                len: chunk.min(len - off) as usize,
                desc: desc as usize,
                peer: fi_addr,
                remote: MrPolicy::remote_addr(virt, base, src_addr + off),
                key,
                data: 0,
                flags,
            }
        });
        Ok(())
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), FabricError> {
        let WriteOp {
            region,
            local_offset,
            len,
            dest_session,
            dest_addr,
            tag,
            cookie,
        } = *write;
        let (r, desc) = self.local_region(region)?;
        r.check_source(local_offset, len)?;
        let chunk = self.opened.chunk;
        let delivery = self.opened.delivery;
        let format_max = self.notice_format.max_chunks();
        let peer = self.peer(dest_session)?;
        let s = &peer.session;
        let Some(dest) = s.region_for(dest_addr, len) else {
            return Err(FabricError::DestOutOfBounds {
                peer: dest_session.to_owned(),
                addr: dest_addr,
                len,
                regions: s.regions.len(),
            });
        };
        let chunks = len.div_ceil(chunk).max(1);
        let peer_format = NoticeFormat::new(s.wide_data);
        if s.notify && chunks > peer_format.max_chunks().min(format_max) {
            return Err(FabricError::TooManyChunks {
                peer: dest_session.to_owned(),
                len,
                chunk,
                chunks,
                max: peer_format.max_chunks(),
            });
        }
        let (fi_addr, key, virt, base, notify) =
            (peer.fi_addr, dest.key, s.virt_addr, dest.base, s.notify);
        let name = Arc::clone(&peer.name);
        let mut flags = u64::from(sys::FI_COMPLETION);
        if delivery == DeliveryMode::Complete {
            flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        let data = if notify {
            flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
            peer_format.encode(tag, chunks)
        } else {
            0
        };
        let deadline = Instant::now() + self.write_timeout;
        let op = OpState {
            kind: OpKind::Write,
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer: name,
            posted: Instant::now(),
            deadline,
            ended: false,
            reported: false,
        };
        self.queue(op, chunks, |w, i| {
            let off = i * chunk;
            Chunk {
                op: w,
                kind: OpKind::Write,
                region: r.id,
                local: (r.addr + local_offset + off) as usize,
                len: chunk.min(len - off) as usize,
                desc: desc as usize,
                peer: fi_addr,
                remote: MrPolicy::remote_addr(virt, base, dest_addr + off),
                key,
                data,
                flags,
            }
        });
        Ok(())
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
    /// queued are dropped, and the peer is removed from the address
    /// vector. With `FI_AV_REMOVE_CLEANUP` on, that closes the provider's
    /// connection to it, so that the chunks posted end (flushed with an
    /// error, or done): this returns once they have, or fails after the
    /// write timeout if the provider has not ended them (their completions
    /// then come when it does). With it off (ferry's default, see
    /// [`crate::ofi::AV_REMOVE_CLEANUP`]) they are reported at once, and
    /// chunks already posted may still move: a write's source may still be
    /// read, and a read's destination still written.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), FabricError> {
        let (mine, ends) = {
            let mut book = self.shared.lock();
            (book.cancel(session), book.final_completions)
        };
        self.evict_dead();
        if mine.is_empty() || !ends {
            return Ok(());
        }
        self.shared.cq.signal();
        let start = Instant::now();
        loop {
            let left = {
                let book = self.shared.lock();
                mine.iter().filter(|&&w| book.holds(w)).count()
            };
            if left == 0 {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= self.write_timeout {
                return Err(FabricError::NotEnded {
                    peer: session.to_owned(),
                    ops: left,
                    waited,
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cq.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Fields drop in order: region, ..., pool last.
    }
}
