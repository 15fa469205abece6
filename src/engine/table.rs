//! The engine's table of transfers: what each posted transfer still waits
//! for, how it went, and when it must be ended.
//!
//! A transfer is a slot, reused once it is released, and named by its
//! slot and the slot's generation: every operation of a transfer is
//! posted with that pair as its cookie, so that a completion finds its
//! transfer by indexing, with no search and no hashing. Deadlines wait in
//! a heap, so that the driver finds the expired ones without a scan.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorferry_core::transport::FaultKind;

use super::EngineError;

/// A transfer's name: its slot and the slot's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Id {
    pub slot: u32,
    pub gen: u32,
}

impl Id {
    /// The cookie its operations are posted with.
    pub fn cookie(self) -> u64 {
        (u64::from(self.slot) << 32) | u64::from(self.gen)
    }

    fn of_cookie(cookie: u64) -> Self {
        Self {
            slot: (cookie >> 32) as u32,
            gen: cookie as u32,
        }
    }
}

/// Where a transfer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferState {
    /// Operations of it may still move bytes.
    Pending,
    /// Every byte arrived (and its notification, if any, was sent).
    Done,
    /// It failed or was ended; none of its bytes moves any more.
    Failed,
}

/// Why a transfer failed.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// An operation failed, or was refused when posted.
    Op {
        verb: &'static str,
        kind: FaultKind,
        message: String,
    },
    /// Its deadline passed and it was ended.
    Timeout {
        pending: usize,
        total: usize,
        waited: Duration,
    },
}

impl Failure {
    pub fn to_error(&self, session: &str) -> EngineError {
        match self {
            Self::Op {
                verb,
                kind,
                message,
            } => EngineError::Transport {
                verb,
                message: message.clone(),
                kind: *kind,
            },
            Self::Timeout {
                pending,
                total,
                waited,
            } => EngineError::Timeout {
                session: session.to_owned(),
                pending: *pending,
                total: *total,
                waited: *waited,
            },
        }
    }
}

/// The peer a transfer moves bytes to or from.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The session id the caller named (the engine's, with the peer's
    /// notification endpoint).
    pub session: String,
    /// The data plane's part of it.
    pub plane: String,
    /// Where the peer takes notifications, if it named a place.
    pub notify: Option<String>,
}

/// A notification to send once a transfer's bytes are all there.
#[derive(Debug)]
pub(crate) struct Attached {
    pub peer: Arc<Peer>,
    pub message: Vec<u8>,
}

#[derive(Debug)]
struct Live {
    peer: Arc<Peer>,
    /// Where its operations' memory of this process lies: from the lowest
    /// address to the end of the highest (a deregistration waits for the
    /// transfers whose span meets the region).
    span: (u64, u64),
    total: u32,
    /// Operations not completed: all of them until the poster says how
    /// many it posted ([`Table::posted`]), since a collector may hand in
    /// completions of the first before the poster is back.
    pending: u32,
    failure: Option<Failure>,
    started: Instant,
    deadline: Instant,
    /// Its operations were ended (its deadline passed, or it was released
    /// unfinished): their completions are on their way.
    ended: bool,
    /// Its last completion came and its notification is being sent.
    sending: bool,
    notify: Option<Vec<u8>>,
    /// Nobody holds it any more: freed once final.
    released: bool,
}

impl Live {
    fn state(&self) -> TransferState {
        match (self.pending, self.sending, &self.failure) {
            (0, false, None) => TransferState::Done,
            (0, false, Some(_)) => TransferState::Failed,
            _ => TransferState::Pending,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    gen: u32,
    live: Option<Live>,
}

/// What a completion or an expiry left to do outside the table's lock.
#[derive(Debug, Default)]
pub(crate) struct Chores {
    /// Transfers that became final (waiters must be woken).
    pub finished: bool,
    /// Notifications to send, then [`Table::sent`].
    pub send: Vec<(Id, Attached)>,
    /// Peers whose operations must be ended (`cancel_transfers`).
    pub end: Vec<Arc<Peer>>,
}

/// The table (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Transfers in the table.
    live: usize,
    /// Deadlines, those of transfers gone included until they come up or
    /// outnumber the live ones (then swept, which keeps the heap no larger
    /// than twice the transfers in flight, at a cost per transfer that
    /// stays constant on average).
    deadlines: BinaryHeap<Reverse<(Instant, Id)>>,
}

impl Table {
    /// A new transfer of `total` operations with `peer`, ended at
    /// `deadline` if still unfinished.
    pub fn open(
        &mut self,
        peer: Arc<Peer>,
        span: (u64, u64),
        total: u32,
        deadline: Instant,
        notify: Option<Vec<u8>>,
    ) -> Id {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.gen = s.gen.wrapping_add(1);
        s.live = Some(Live {
            peer,
            span,
            total,
            pending: total,
            failure: None,
            started: Instant::now(),
            deadline,
            ended: false,
            sending: false,
            notify,
            released: false,
        });
        let id = Id { slot, gen: s.gen };
        self.live += 1;
        if self.deadlines.len() >= 64 && self.deadlines.len() > 2 * self.live {
            let slots = &self.slots;
            self.deadlines.retain(|Reverse((_, d))| {
                slots
                    .get(d.slot as usize)
                    .is_some_and(|s| s.gen == d.gen && s.live.is_some())
            });
        }
        self.deadlines.push(Reverse((deadline, id)));
        id
    }

    fn live(&mut self, id: Id) -> Option<&mut Live> {
        self.slots
            .get_mut(id.slot as usize)
            .filter(|s| s.gen == id.gen)
            .and_then(|s| s.live.as_mut())
    }

    /// Records that `posted` of the transfer's operations were posted, and
    /// why posting stopped there, if it did.
    pub fn posted(&mut self, id: Id, posted: u32, refused: Option<Failure>, chores: &mut Chores) {
        if let Some(t) = self.live(id) {
            t.pending = t.pending.saturating_sub(t.total.saturating_sub(posted));
            if refused.is_some() {
                t.failure = refused;
                // A transfer that failed to post its rest carries no
                // notification: its bytes will not all be there.
                t.notify = None;
            }
            // Ended while it was being posted (its deadline came, or it
            // was released): the peer's operations were ended before
            // these were posted, so they are ended again.
            if t.ended && t.pending > 0 {
                chores.end.push(Arc::clone(&t.peer));
            }
        }
        self.settle(id, chores);
    }

    /// One operation of a transfer completed.
    pub fn complete(&mut self, cookie: u64, outcome: Result<(), Failure>, chores: &mut Chores) {
        let id = Id::of_cookie(cookie);
        let Some(t) = self.live(id) else { return };
        t.pending = t.pending.saturating_sub(1);
        if let Err(f) = outcome {
            if t.failure.is_none() {
                t.failure = Some(f);
            }
            t.notify = None;
        }
        self.settle(id, chores);
    }

    /// What a transfer whose operations may all have completed does next:
    /// send its notification, or become final.
    fn settle(&mut self, id: Id, chores: &mut Chores) {
        let Some(t) = self.live(id) else { return };
        if t.pending > 0 || t.sending {
            return;
        }
        if t.failure.is_none() {
            if let Some(message) = t.notify.take() {
                if t.released {
                    // Released before it finished: nobody is owed it, and
                    // its bytes' arrival is no longer news of anything.
                } else {
                    t.sending = true;
                    chores.send.push((
                        id,
                        Attached {
                            peer: Arc::clone(&t.peer),
                            message,
                        },
                    ));
                    return;
                }
            }
        }
        chores.finished = true;
        if t.released {
            self.free(id);
        }
    }

    /// A notification of a transfer was sent (or failed to be).
    pub fn sent(&mut self, id: Id, outcome: Result<(), Failure>, chores: &mut Chores) {
        if let Some(t) = self.live(id) {
            t.sending = false;
            if let Err(f) = outcome {
                t.failure.get_or_insert(f);
            }
        }
        self.settle(id, chores);
    }

    fn free(&mut self, id: Id) {
        if let Some(s) = self.slots.get_mut(id.slot as usize) {
            if s.gen == id.gen && s.live.take().is_some() {
                self.free.push(id.slot);
                self.live -= 1;
            }
        }
    }

    /// When the transfer must be final by: its deadline, or `ended` if it
    /// was ended earlier (released unfinished), plus the time the data
    /// plane is given to end its operations ([`super::END_GRACE`]).
    pub fn limit(&mut self, id: Id, ended: Option<Instant>) -> Option<Instant> {
        let t = self.live(id)?;
        let from = ended.map_or(t.deadline, |e| e.min(t.deadline));
        Some(super::limit_of(from))
    }

    /// A transfer not final whose memory of this process may lie in
    /// `[addr, addr + len)`, and when it must be final by (see
    /// [`limit`](Self::limit)). Reads every transfer: a deregistration's
    /// cost, not a message's.
    pub fn touching(&self, addr: u64, len: u64) -> Option<(Id, Instant)> {
        let end = addr.saturating_add(len);
        self.slots.iter().enumerate().find_map(|(slot, s)| {
            let t = s.live.as_ref()?;
            let (lo, hi) = t.span;
            (t.state() == TransferState::Pending && lo < end && addr < hi).then(|| {
                (
                    Id {
                        slot: slot as u32,
                        gen: s.gen,
                    },
                    super::limit_of(t.deadline),
                )
            })
        })
    }

    /// The session id of the transfer's peer.
    pub fn session(&mut self, id: Id) -> Option<String> {
        self.live(id).map(|t| t.peer.session.clone())
    }

    /// Operations of the transfer not yet completed.
    pub fn pending(&mut self, id: Id) -> Option<(usize, usize)> {
        self.live(id)
            .map(|t| (t.pending as usize, t.total as usize))
    }

    /// Where a transfer stands (`None`: no such transfer).
    pub fn state(&mut self, id: Id) -> Option<TransferState> {
        self.live(id).map(|t| t.state())
    }

    /// Why it failed, as an error naming its peer.
    pub fn failure(&mut self, id: Id) -> Option<EngineError> {
        let t = self.live(id)?;
        let f = t.failure.as_ref()?;
        Some(f.to_error(&t.peer.session))
    }

    /// Ends the transfer now (its deadline passed, or it is released
    /// unfinished): its peer goes into `chores.end` unless it was ended
    /// already. `timed_out` records a timeout as its failure.
    pub fn end(&mut self, id: Id, timed_out: bool, chores: &mut Chores) {
        let Some(t) = self.live(id) else { return };
        if t.pending == 0 || t.ended {
            return;
        }
        t.ended = true;
        t.notify = None;
        if timed_out && t.failure.is_none() {
            t.failure = Some(Failure::Timeout {
                pending: t.pending as usize,
                total: t.total as usize,
                waited: t.started.elapsed(),
            });
        }
        chores.end.push(Arc::clone(&t.peer));
    }

    /// Ends every transfer whose deadline is past.
    pub fn expire(&mut self, now: Instant, chores: &mut Chores) {
        while let Some(Reverse((deadline, id))) = self.deadlines.peek().copied() {
            if deadline > now {
                break;
            }
            self.deadlines.pop();
            self.end(id, true, chores);
        }
    }

    /// The earliest deadline still waiting (which may be of a transfer
    /// that finished: the heap keeps those until they come up).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.peek().map(|Reverse((d, _))| *d)
    }

    /// The caller holds the transfer no more: freed now if final, else
    /// once it is (ending it is the caller's business: [`Table::end`]).
    pub fn release(&mut self, id: Id) {
        let Some(t) = self.live(id) else { return };
        t.released = true;
        if t.state() != TransferState::Pending {
            self.free(id);
        }
    }

    /// Transfers in the table (final ones not yet released included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> Arc<Peer> {
        Arc::new(Peer {
            session: "s".into(),
            plane: "s".into(),
            notify: None,
        })
    }

    /// A minute from now: a deadline no test reaches.
    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// A table with one transfer of `ops` operations to [`peer`], every
    /// one posted, that sends `notify` once they complete.
    fn posted(ops: u32, notify: Option<&[u8]>) -> (Table, Id, Chores) {
        let mut t = Table::default();
        let id = t.open(peer(), (0, 0), ops, far(), notify.map(<[u8]>::to_vec));
        let mut c = Chores::default();
        t.posted(id, ops, None, &mut c);
        (t, id, c)
    }

    /// A table with one transfer of `ops` operations to [`peer`], none
    /// posted yet, whose deadline is now; and that instant.
    fn due_now(ops: u32) -> (Table, Id, Instant) {
        let mut t = Table::default();
        let now = Instant::now();
        let id = t.open(peer(), (0, 0), ops, now, None);
        (t, id, now)
    }

    fn op_failure() -> Failure {
        Failure::Op {
            verb: "write",
            kind: FaultKind::PeerGone,
            message: "gone".into(),
        }
    }

    #[test]
    fn a_transfer_is_done_when_its_last_operation_completes() {
        let (mut t, id, mut c) = posted(3, None);
        t.complete(id.cookie(), Ok(()), &mut c);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Pending));
        assert!(!c.finished);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Done));
        assert!(c.finished);
        t.release(id);
        assert_eq!(t.state(id), None);
        // The slot is reused under a new generation: a late completion
        // with the old cookie touches nothing.
        let again = t.open(peer(), (0, 0), 1, far(), None);
        assert_eq!(again.slot, id.slot);
        assert_ne!(again.gen, id.gen);
        t.posted(again, 1, None, &mut c);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.state(again), Some(TransferState::Pending));
    }

    #[test]
    fn completions_that_come_before_the_poster_is_back_are_counted() {
        let mut t = Table::default();
        let id = t.open(peer(), (0, 0), 3, far(), None);
        let mut c = Chores::default();
        // Two posted, both completed by a collector, then the third
        // refused.
        t.complete(id.cookie(), Ok(()), &mut c);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Pending));
        t.posted(id, 2, Some(op_failure()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Failed));
        // All three posted and completed before the poster is back.
        let id = t.open(peer(), (0, 0), 3, far(), None);
        for _ in 0..3 {
            t.complete(id.cookie(), Ok(()), &mut c);
        }
        t.posted(id, 3, None, &mut c);
        assert_eq!(t.state(id), Some(TransferState::Done));
    }

    #[test]
    fn a_transfer_ended_while_it_is_posted_is_ended_again_once_posted() {
        let (mut t, id, now) = due_now(2);
        let mut c = Chores::default();
        t.expire(now, &mut c);
        assert_eq!(c.end.len(), 1);
        let mut c = Chores::default();
        t.posted(id, 2, None, &mut c);
        assert_eq!(
            c.end.len(),
            1,
            "operations posted after the end were not ended"
        );
        t.complete(id.cookie(), Ok(()), &mut c);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.failure(id).unwrap().kind(), FaultKind::Timeout);
    }

    #[test]
    fn a_failed_operation_fails_the_transfer_and_drops_its_notification() {
        let (mut t, id, mut c) = posted(2, Some(b"hi"));
        t.complete(id.cookie(), Err(op_failure()), &mut c);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Failed));
        assert!(c.send.is_empty());
        assert_eq!(t.failure(id).unwrap().kind(), FaultKind::PeerGone);
    }

    #[test]
    fn a_notification_is_sent_before_the_transfer_is_final() {
        let (mut t, id, mut c) = posted(1, Some(b"hi"));
        t.complete(id.cookie(), Ok(()), &mut c);
        assert_eq!(c.send.len(), 1);
        assert_eq!(t.state(id), Some(TransferState::Pending));
        t.sent(id, Ok(()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Done));
    }

    #[test]
    fn an_expired_transfer_is_ended_once_and_fails_with_a_timeout() {
        let (mut t, id, now) = due_now(2);
        let later = t.open(peer(), (0, 0), 1, now + Duration::from_secs(60), None);
        let mut c = Chores::default();
        t.posted(id, 2, None, &mut c);
        t.posted(later, 1, None, &mut c);
        t.expire(now, &mut c);
        assert_eq!(c.end.len(), 1);
        // Still pending until its ended operations complete.
        assert_eq!(t.state(id), Some(TransferState::Pending));
        t.end(id, true, &mut c);
        assert_eq!(c.end.len(), 1, "ended twice");
        t.complete(id.cookie(), Ok(()), &mut c);
        t.complete(id.cookie(), Err(op_failure()), &mut c);
        assert_eq!(t.state(id), Some(TransferState::Failed));
        assert_eq!(t.failure(id).unwrap().kind(), FaultKind::Timeout);
        assert_eq!(t.state(later), Some(TransferState::Pending));
    }

    #[test]
    fn a_transfer_released_unfinished_is_freed_when_its_operations_complete() {
        let (mut t, id, mut c) = posted(1, Some(b"late"));
        t.release(id);
        assert_eq!(t.len(), 1);
        t.complete(id.cookie(), Ok(()), &mut c);
        assert!(c.send.is_empty(), "a released transfer notified");
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn deadlines_of_transfers_gone_do_not_pile_up() {
        let mut t = Table::default();
        let far = far();
        let mut c = Chores::default();
        for _ in 0..10_000 {
            let id = t.open(peer(), (0, 0), 1, far, None);
            t.posted(id, 1, None, &mut c);
            t.complete(id.cookie(), Ok(()), &mut c);
            t.release(id);
        }
        assert_eq!(t.len(), 0);
        assert!(
            t.deadlines.len() <= 64,
            "{} deadlines kept",
            t.deadlines.len()
        );
    }
}
