//! The writes and reads in flight: their state, the chunks waiting to be
//! posted, and the operation contexts handed to the provider.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorferry_core::transport::Completion;
use tensorferry_fabric_sys as sys;
use tracing::debug;

use crate::error::{FabricError, OpKind};
use crate::notice::NoticeBook;

/// One write or read in flight.
pub(super) struct OpState {
    pub(super) kind: OpKind,
    pub(super) cookie: u64,
    /// Chunks posted and not yet completed.
    pub(super) in_flight: u32,
    /// Chunks waiting in the backlog to be posted.
    pub(super) queued: u32,
    pub(super) error: Option<FabricError>,
    /// The peer written to or read from.
    pub(super) peer: Arc<str>,
    pub(super) posted: Instant,
    pub(super) deadline: Instant,
    /// Given up (timed out or cancelled): its chunks still queued are not
    /// posted, and it completes, failed, once those posted have completed
    /// or the endpoint was reset under them (`reset`).
    pub(super) ended: bool,
}

/// One chunk waiting to be posted: the queue was full (`-FI_EAGAIN`, which
/// is also what a peer that cannot be reached yet answers) or every context
/// was in use. A posted chunk is kept with its context, so that one a
/// reset of the endpoint cut short can be posted again.
#[derive(Clone, Copy)]
pub(super) struct Chunk {
    /// The op's slot.
    pub(super) op: u32,
    pub(super) kind: OpKind,
    /// The local region (its id: a write's source, a read's
    /// destination), whose deregistration fails the chunk.
    pub(super) region: u32,
    pub(super) local: usize,
    pub(super) len: usize,
    pub(super) desc: usize,
    /// The peer written to or read from.
    pub(super) peer: sys::fi_addr_t,
    pub(super) remote: u64,
    pub(super) key: u64,
    pub(super) data: u64,
    pub(super) flags: u64,
}

/// The writes and reads in flight and what became of them: chunks
/// waiting to be posted, the operation contexts they hold, finished ops
/// and arrived notices. Shared by the posting and the progress thread.
pub(super) struct OpBook {
    pub(super) backlog: VecDeque<Chunk>,
    pub(super) free_ctx: Vec<u32>,
    /// Context index → op slot (`u32::MAX`: the context is free).
    pub(super) ctx_owner: Vec<u32>,
    /// Context index → the chunk posted with it.
    pub(super) ctx_chunk: Vec<Option<Chunk>>,
    pub(super) ops: Vec<Option<OpState>>,
    pub(super) free_ops: Vec<u32>,
    pub(super) done: VecDeque<Completion<FabricError>>,
    pub(super) notices: NoticeBook,
    /// Peers whose ops failed as gone or timed out: removed from the
    /// address vector (closing the connection) by the runtime's thread, at
    /// its next post or poll.
    pub(super) evict: Vec<Arc<str>>,
    /// Held by a test: the progress thread stops driving the queue.
    pub(super) held: bool,
    /// A completion or notice arrived since the wake descriptor was last
    /// signalled.
    pub(super) news: bool,
}

impl OpBook {
    /// One chunk of op `w` finished (with `err` if it failed).
    pub(super) fn chunk_done(&mut self, w: u32, err: Option<FabricError>) {
        let Some(Some(ws)) = self.ops.get_mut(w as usize) else {
            return;
        };
        ws.in_flight = ws.in_flight.saturating_sub(1);
        if ws.error.is_none() {
            ws.error = err;
        }
        self.finish_if_done(w);
    }

    pub(super) fn finish_if_done(&mut self, w: u32) {
        let Some(Some(ws)) = self.ops.get(w as usize) else {
            return;
        };
        if ws.in_flight > 0 || ws.queued > 0 {
            return;
        }
        let Some(ws) = self.ops[w as usize].take() else {
            return;
        };
        self.free_ops.push(w);
        if let Some(e) = &ws.error {
            if matches!(e.kind(), tensorferry_core::transport::FaultKind::PeerGone) {
                self.evict.push(Arc::clone(&ws.peer));
            }
        }
        debug!(
            cookie = ws.cookie,
            op = ?ws.kind,
            took_us = ws.posted.elapsed().as_micros() as u64,
            ok = ws.error.is_none(),
            "op done"
        );
        self.done.push_back(Completion {
            cookie: ws.cookie,
            result: ws.error.map_or(Ok(()), Err),
        });
        self.news = true;
    }

    /// Ends the ops past their deadline (see [`end`](Self::end));
    /// returns how many.
    pub(super) fn expire(&mut self, now: Instant, timeout: Duration) -> usize {
        self.end_where(
            |ws| now >= ws.deadline,
            |op, peer| FabricError::Timeout {
                op,
                peer: peer.to_owned(),
                after: timeout,
            },
        )
        .len()
    }

    /// Ends the writes to and reads from `peer` not yet finished (see
    /// [`end`](Self::end)); returns their slots.
    pub(super) fn cancel(&mut self, peer: &str) -> Vec<u32> {
        self.end_where(
            |ws| &*ws.peer == peer,
            |op, peer| FabricError::Cancelled {
                op,
                peer: peer.to_owned(),
            },
        )
    }

    /// Ends each op not yet ended that `which` picks, with the error
    /// `error` makes of its kind and peer (see [`end`](Self::end));
    /// returns their slots.
    fn end_where(
        &mut self,
        which: impl Fn(&OpState) -> bool,
        error: impl Fn(OpKind, &str) -> FabricError,
    ) -> Vec<u32> {
        let picked: Vec<u32> = self
            .live()
            .filter(|(_, ws)| which(ws))
            .map(|(w, _)| w)
            .collect();
        for &w in &picked {
            self.end(w, &error);
        }
        picked
    }

    /// The ops not yet ended, with their slots.
    fn live(&self) -> impl Iterator<Item = (u32, &OpState)> {
        self.ops
            .iter()
            .enumerate()
            .filter_map(|(w, ws)| ws.as_ref().map(|ws| (w as u32, ws)))
            .filter(|(_, ws)| !ws.ended)
    }

    /// Gives op `w` up: its queued chunks are dropped, and it completes
    /// with `error` (unless it failed already) once the chunks posted have
    /// completed, or were cut short by a reset of the endpoint (which the
    /// transport makes where they do not complete at once). Reporting it
    /// earlier would let its caller reuse the memory while a chunk may
    /// still move: a write's source still read, a read's destination
    /// still written.
    fn end(&mut self, w: u32, error: impl FnOnce(OpKind, &str) -> FabricError) {
        let Some(Some(ws)) = self.ops.get_mut(w as usize) else {
            return;
        };
        ws.ended = true;
        if ws.error.is_none() {
            ws.error = Some(error(ws.kind, &ws.peer));
        }
        let peer = Arc::clone(&ws.peer);
        let before = self.backlog.len();
        self.backlog.retain(|c| c.op != w);
        let dropped = (before - self.backlog.len()) as u32;
        if let Some(Some(ws)) = self.ops.get_mut(w as usize) {
            ws.queued = ws.queued.saturating_sub(dropped);
        }
        if !self.evict.contains(&peer) {
            self.evict.push(peer);
        }
        self.finish_if_done(w);
    }

    /// True if an op to `peer` still has chunks queued or posted.
    pub(super) fn busy_with(&self, peer: &str) -> bool {
        self.ops
            .iter()
            .flatten()
            .any(|ws| *ws.peer == *peer && (ws.queued > 0 || ws.in_flight > 0))
    }

    /// True if an op that was given up still has chunks posted: only a
    /// reset of the endpoint ends those for sure.
    pub(super) fn ended_in_flight(&self) -> bool {
        self.ops
            .iter()
            .flatten()
            .any(|ws| ws.ended && ws.in_flight > 0)
    }

    /// The chunks posted from local region `region`, and the peers they
    /// go to or come from.
    pub(super) fn posted_from(&self, region: u32) -> (usize, Vec<Arc<str>>) {
        let mut peers: Vec<Arc<str>> = Vec::new();
        let mut n = 0;
        for c in self
            .ctx_chunk
            .iter()
            .flatten()
            .filter(|c| c.region == region)
        {
            n += 1;
            if let Some(Some(ws)) = self.ops.get(c.op as usize) {
                if !peers.contains(&ws.peer) {
                    peers.push(Arc::clone(&ws.peer));
                }
            }
        }
        (n, peers)
    }

    /// The endpoint the chunks posted went through is closed (nothing of
    /// theirs moves any more, and their completions, read since, will not
    /// come): frees their contexts. Chunks of ops given up complete them
    /// with their error; the others are queued to be posted again where
    /// `again` (a chunk written or read twice leaves the same bytes), else
    /// fail their op with `cut`.
    pub(super) fn cut_posted(&mut self, again: bool, cut: impl Fn(OpKind, &str) -> FabricError) {
        for i in 0..self.ctx_owner.len() as u32 {
            self.cut_one(i, again, &cut);
        }
    }

    /// The chunk posted with context `i` was cut short (see
    /// [`cut_posted`](Self::cut_posted)); nothing if the context is free.
    pub(super) fn cut_one(
        &mut self,
        i: u32,
        again: bool,
        cut: impl Fn(OpKind, &str) -> FabricError,
    ) {
        let chunk = self.ctx_chunk.get(i as usize).copied().flatten();
        let Some(w) = self.release_ctx(i) else {
            return;
        };
        let Some(Some(ws)) = self.ops.get_mut(w as usize) else {
            return;
        };
        ws.in_flight = ws.in_flight.saturating_sub(1);
        match chunk {
            Some(c) if again && !ws.ended && ws.error.is_none() => {
                ws.queued += 1;
                self.backlog.push_front(c);
            }
            _ => {
                if ws.error.is_none() {
                    ws.error = Some(cut(ws.kind, &ws.peer));
                }
                self.finish_if_done(w);
            }
        }
    }

    /// Frees context `i` and returns the op slot that held it, or `None`
    /// if none did: a provider that reports one operation twice
    /// (libfabric 1.17's tcp does for a read whose connection closes while
    /// its response is arriving) must not free a context twice, which
    /// would hand it to two chunks at once.
    pub(super) fn release_ctx(&mut self, i: u32) -> Option<u32> {
        let owner = self.ctx_owner.get_mut(i as usize)?;
        let w = std::mem::replace(owner, u32::MAX);
        if w == u32::MAX {
            return None;
        }
        if let Some(c) = self.ctx_chunk.get_mut(i as usize) {
            *c = None;
        }
        self.free_ctx.push(i);
        Some(w)
    }

    /// True if op slot `w` holds an op that is still in flight.
    pub(super) fn holds(&self, w: u32) -> bool {
        self.ops.get(w as usize).is_some_and(Option::is_some)
    }
}

/// Operation contexts handed to the provider: `FI_CONTEXT2` space each,
/// written by the provider only.
pub(super) struct Contexts(pub(super) Box<[std::cell::UnsafeCell<sys::fi_context2>]>);

// SAFETY: the cells are only written by the provider, through pointers
// handed out for one in-flight operation each (the free list in `OpBook`
// guarantees exclusivity); Rust code never reads or writes them.
unsafe impl Sync for Contexts {}
// SAFETY: as above.
unsafe impl Send for Contexts {}

impl Contexts {
    pub(super) fn ptr(&self, i: u32) -> *mut c_void {
        self.0[i as usize].get().cast()
    }

    pub(super) fn index(&self, p: *mut c_void) -> Option<u32> {
        let base = self.0.as_ptr() as usize;
        let size = std::mem::size_of::<sys::fi_context2>();
        let off = (p as usize).checked_sub(base)?;
        if off % size != 0 {
            return None;
        }
        let i = off / size;
        (i < self.0.len()).then_some(i as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::NoticeFormat;

    fn book(contexts: u32) -> OpBook {
        OpBook {
            backlog: VecDeque::new(),
            free_ctx: (0..contexts).rev().collect(),
            ctx_owner: vec![u32::MAX; contexts as usize],
            ctx_chunk: vec![None; contexts as usize],
            ops: Vec::new(),
            free_ops: Vec::new(),
            done: VecDeque::new(),
            notices: NoticeBook::new(NoticeFormat::new(true), Duration::from_secs(1), 16),
            evict: Vec::new(),
            held: false,
            news: false,
        }
    }

    #[test]
    fn a_context_reported_twice_is_freed_once() {
        let mut b = book(2);
        let i = b.free_ctx.pop().unwrap();
        b.ctx_owner[i as usize] = 7;
        assert_eq!(b.release_ctx(i), Some(7));
        // The provider reports the same operation again: the context is
        // not handed out twice.
        assert_eq!(b.release_ctx(i), None);
        assert_eq!(b.free_ctx.iter().filter(|&&c| c == i).count(), 1);
        assert_eq!(b.release_ctx(99), None);
    }
}
