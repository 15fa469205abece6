//! The progress thread: it drives the completion queue (which
//! manual-progress providers need even on a side that only receives),
//! posts the backlog, records completions and notices, and signals the
//! runtime's wake descriptor.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tensorferry_fabric_sys as sys;
use tensorferry_hostmem::EventFd;
use tracing::{debug, warn};

use super::book::{Chunk, Contexts, OpBook};
use crate::error::{FabricError, OpKind};
use crate::ofi::{Cq, Endpoint, Rma};

/// What the runtime's thread and the progress thread share.
pub(super) struct Shared {
    /// The completion queue (a reset replaces it with the endpoint: 1.17's
    /// rxm leaves a queue whose endpoint closed unusable).
    pub(super) cq: RwLock<Arc<Cq>>,
    /// The endpoint chunks are posted through: taken out (and closed)
    /// while the transport resets it, when nothing is posted.
    pub(super) endpoint: RwLock<Option<Arc<Endpoint>>>,
    /// Asked of the progress thread: stop at the top of its loop (reading
    /// nothing, posting nothing) until it is cleared.
    pub(super) pause: AtomicBool,
    /// The progress thread's answer: it is stopped there.
    pub(super) paused: AtomicBool,
    /// Signalled by the progress thread when completions or notices
    /// arrive, so that the runtime can sleep on it with its control
    /// channel: readable while the runtime has news to collect.
    pub(super) wake: EventFd,
    pub(super) book: Mutex<OpBook>,
    pub(super) stop: AtomicBool,
    /// When the progress thread last went round its loop, in ms since
    /// `born`: a provider call that never returns shows here.
    pub(super) beat: AtomicU64,
    pub(super) born: Instant,
    pub(super) contexts: Contexts,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, OpBook> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The completion queue in use.
    pub(super) fn cq(&self) -> Arc<Cq> {
        Arc::clone(&self.cq.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Posts what the backlog holds, in order, as far as contexts and the
    /// provider's queue allow; returns true if chunks remain. The book is
    /// not held while a chunk is posted: a provider may spin inside the
    /// call (shm waits for its peer's queue lock), and completions must go
    /// on being recorded meanwhile.
    pub(super) fn drain(&self) -> bool {
        let slot = self.endpoint.read().unwrap_or_else(PoisonError::into_inner);
        let Some(endpoint) = slot.as_deref() else {
            // Being reset: the backlog waits for the new endpoint.
            return !self.lock().backlog.is_empty();
        };
        let mut tries = self.lock().backlog.len();
        while tries > 0 {
            tries -= 1;
            // Take a chunk and a context, and count the chunk in flight
            // before posting, so that a completion read at once finds it.
            let (c, ctx) = {
                let mut book = self.lock();
                let Some(c) = book.backlog.pop_front() else {
                    break;
                };
                let live = book
                    .ops
                    .get(c.op as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|ws| ws.error.is_none() && !ws.ended);
                if !live {
                    // Its op failed or timed out: the chunk is not posted.
                    if let Some(ws) = book.ops.get_mut(c.op as usize).and_then(Option::as_mut) {
                        ws.queued -= 1;
                    }
                    book.finish_if_done(c.op);
                    continue;
                }
                let Some(ctx) = book.free_ctx.pop() else {
                    book.backlog.push_front(c);
                    break;
                };
                book.ctx_owner[ctx as usize] = c.op;
                book.ctx_chunk[ctx as usize] = Some(c);
                if let Some(ws) = book.ops.get_mut(c.op as usize).and_then(Option::as_mut) {
                    ws.queued -= 1;
                    ws.in_flight += 1;
                }
                (c, ctx)
            };
            let rma = Rma {
                local: c.local as *mut u8,
                len: c.len,
                desc: c.desc as *mut c_void,
                peer: c.peer,
                remote_addr: c.remote,
                key: c.key,
                data: c.data,
                flags: c.flags,
                context: self.contexts.ptr(ctx),
            };
            // SAFETY: the chunk lies in the registered region (checked when
            // it was queued; deregistering fails the backlog first), which
            // the caller leaves to the op until its completion (a read's
            // destination untouched), and the context cell is reserved for
            // it until its completion.
            let ret = unsafe { endpoint.post_rma(c.kind, &rma) };
            if ret >= 0 {
                continue;
            }
            // Not posted, so no completion comes: undo.
            let mut book = self.lock();
            book.ctx_owner[ctx as usize] = u32::MAX;
            book.ctx_chunk[ctx as usize] = None;
            book.free_ctx.push(ctx);
            let w = c.op;
            let Some(ws) = book.ops.get_mut(w as usize).and_then(Option::as_mut) else {
                continue;
            };
            ws.in_flight -= 1;
            if ret == -(sys::FI_EAGAIN as isize) {
                ws.queued += 1;
                book.backlog.push_back(c);
                continue;
            }
            if let Err(e) = crate::ofi::check(c.kind.call(), ret, Some(&ws.peer)) {
                if ws.error.is_none() {
                    ws.error = Some(e);
                }
            }
            book.finish_if_done(w);
        }
        !self.lock().backlog.is_empty()
    }

    /// Fails every queued chunk from `region` (it is going away); the
    /// others stay queued.
    pub(super) fn fail_backlog(&self, region: u32, why: &str) {
        let mut book = self.lock();
        let (gone, kept): (VecDeque<Chunk>, VecDeque<Chunk>) = std::mem::take(&mut book.backlog)
            .into_iter()
            .partition(|c| c.region == region);
        book.backlog = kept;
        for c in gone {
            if let Some(ws) = book.ops.get_mut(c.op as usize).and_then(Option::as_mut) {
                ws.queued -= 1;
                if ws.error.is_none() {
                    ws.error = Some(FabricError::Call {
                        call: c.kind.call(),
                        errno: sys::FI_ECANCELED as i32,
                        text: why.to_owned(),
                        peer: Some(ws.peer.to_string()),
                    });
                }
            }
            book.finish_if_done(c.op);
        }
    }

    pub(super) fn handle(&self, entries: &[sys::fi_cq_data_entry]) {
        let now = Instant::now();
        let mut book = self.lock();
        for e in entries {
            if e.flags & u64::from(sys::FI_REMOTE_CQ_DATA) != 0 {
                book.notices.record(e.data, now);
                book.news = true;
                continue;
            }
            let Some(i) = self.contexts.index(e.op_context) else {
                debug!(flags = e.flags, "completion for no context of ours");
                continue;
            };
            let Some(w) = book.release_ctx(i) else {
                warn!(flags = e.flags, "a second completion for one op; ignored");
                continue;
            };
            book.chunk_done(w, None);
        }
    }

    pub(super) fn handle_error(&self, e: &sys::fi_cq_err_entry, text: String) {
        let mut book = self.lock();
        let Some(i) = self.contexts.index(e.op_context) else {
            warn!(errno = e.err, prov_errno = e.prov_errno, %text, "completion error for no op of ours");
            return;
        };
        let Some(w) = book.release_ctx(i) else {
            warn!(errno = e.err, prov_errno = e.prov_errno, %text, "a second completion for one op; ignored");
            return;
        };
        let (op, peer) = book
            .ops
            .get(w as usize)
            .and_then(|s| s.as_ref())
            .map_or((OpKind::Write, String::new()), |s| {
                (s.kind, s.peer.to_string())
            });
        warn!(%peer, ?op, errno = e.err, prov_errno = e.prov_errno, %text, "op failed");
        book.chunk_done(
            w,
            Some(FabricError::Completion {
                op,
                peer,
                errno: e.err,
                prov_errno: e.prov_errno,
                text,
            }),
        );
    }

    /// The progress thread: drive the queue, post the backlog, hand
    /// completions over, expire late writes.
    /// Write deadlines are kept by the runtime's side
    /// (`FabricTransport::poll_completion`), which goes on even when a
    /// provider call here never returns.
    pub(super) fn run(&self) {
        let mut buf = [sys::fi_cq_data_entry::default(); 64];
        let mut last_work = Instant::now();
        let mut last_prune = Instant::now();
        // After work, poll a little before sleeping: the next event of a
        // busy stream is usually that close.
        let spin = Duration::from_micros(50);
        while !self.stop.load(Ordering::Acquire) {
            self.beat
                .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
            if self.pause.load(Ordering::Acquire) {
                self.paused.store(true, Ordering::Release);
                std::thread::sleep(Duration::from_micros(100));
                continue;
            }
            self.paused.store(false, Ordering::Release);
            let now = Instant::now();
            let (held, news, queued) = {
                let mut book = self.lock();
                if now.duration_since(last_prune) >= Duration::from_secs(1) {
                    last_prune = now;
                    book.notices.prune(now);
                }
                let news = std::mem::take(&mut book.news);
                (book.held, news, !book.backlog.is_empty())
            };
            if news {
                self.wake.signal();
            }
            if held {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let backlog = queued && self.drain();
            let idle = now.duration_since(last_work) >= spin;
            let cq = self.cq();
            let r = if idle && cq.waitable() && !backlog {
                cq.sread(&mut buf, 5)
            } else {
                cq.read(&mut buf)
            };
            match r {
                Ok(0) => {
                    if idle && (backlog || !cq.waitable()) {
                        std::thread::sleep(Duration::from_micros(20));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                // What they bring is announced at the top of the loop.
                Ok(n) => {
                    last_work = Instant::now();
                    self.handle(&buf[..n]);
                }
                Err(errno) if errno == sys::FI_EAVAIL as i32 => {
                    last_work = Instant::now();
                    if let Some((e, text)) = cq.read_err() {
                        self.handle_error(&e, text);
                    }
                }
                Err(errno) => {
                    warn!(errno, error = %crate::ofi::strerror(errno), "fi_cq_read failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// What the progress thread's silence means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stall {
    /// It went round its loop lately (or is held on purpose).
    None,
    /// It is inside one provider call for longer than the write timeout,
    /// and no write failed for it: a provider may rightly copy a window of
    /// large writes inside one queue read. Not a fault.
    Long,
    /// Writes timed out while it was silent: said once, as an error.
    Failing,
    /// It came back after `Failing` was said.
    Back,
}

/// What a progress thread silent for `silent` means, given the write
/// timeout, whether it is held on purpose, how many writes just expired,
/// and whether `Failing` was said already.
pub(super) fn stall(
    silent: Duration,
    timeout: Duration,
    held: bool,
    expired: usize,
    reported: bool,
) -> Stall {
    let stuck = silent > timeout && !held;
    match (stuck, reported) {
        (true, false) if expired > 0 => Stall::Failing,
        (true, _) => Stall::Long,
        (false, true) => Stall::Back,
        (false, false) => Stall::None,
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn a_long_provider_call_is_an_error_only_once_writes_fail_for_it() {
        let t = Duration::from_secs(5);
        let long = Duration::from_secs(6);
        // A healthy run whose provider copies a large window in one call.
        assert_eq!(stall(long, t, false, 0, false), Stall::Long);
        assert_eq!(
            stall(Duration::from_millis(3), t, false, 0, false),
            Stall::None
        );
        // Held on purpose (a test pausing the thread) is not silence.
        assert_eq!(stall(long, t, true, 3, false), Stall::None);
        assert_eq!(stall(long, t, false, 2, false), Stall::Failing);
        // Said once; then it comes back.
        assert_eq!(stall(long, t, false, 2, true), Stall::Long);
        assert_eq!(stall(Duration::ZERO, t, false, 0, true), Stall::Back);
    }
}
