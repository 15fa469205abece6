//! The engine over a data plane's `Transport` (every backend's): the
//! transport and its regions behind one lock, the table of transfers
//! behind another, a thread that drives the transport (so that a process
//! that only receives still answers peers, completions are found without
//! a caller, and deadlines are kept), and callers that post, collect what
//! has completed themselves (a data plane that completes at the next poll
//! costs no thread hop), and wait on their transfers.
//!
//! Locks are taken plane first, table second, and never the other way, so
//! that a poster and a collector cannot deadlock.
//!
//! Modules: what the handles and the driver thread share, and what either
//! does with it (`shared`); this module holds the driver thread and the
//! handles' side ([`Driver`]).
// Registering memory with a transport is unsafe by its contract.
#![allow(unsafe_code)]

mod shared;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{FaultKind, ReadOp, Transport, WriteOp, WriteTag};

use super::notify::{self, Notification, Notifier};
use super::table::{Chores, Failure, Id, Peer, Table, TransferState};
use super::{post_verb, Direction, EngineError, Op};
use shared::{lock, no_endpoint, Plane, Shared};

/// Longest wait on the transport's wake descriptor between checks of the
/// stop flag and the deadlines.
const TICK: Duration = Duration::from_millis(5);

/// What the engine's handles need of a driven data plane (object safe, so
/// that one engine type holds any backend).
pub(crate) trait Driver: Send + Sync {
    fn session_id(&self) -> String;
    /// # Safety
    /// As [`super::TransferEngine::register`].
    unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError>;
    fn deregister(&self, addr: u64) -> Result<(), EngineError>;
    fn post(
        &self,
        direction: Direction,
        peer: Arc<Peer>,
        ops: &[Op],
        deadline: Instant,
        notify: Option<Vec<u8>>,
    ) -> Result<Id, EngineError>;
    fn state(&self, id: Id) -> Option<TransferState>;
    fn wait(&self, id: Id, until: Option<Instant>) -> Option<TransferState>;
    fn failure(&self, id: Id) -> Option<EngineError>;
    /// Ends the transfer if it is still running, waits until it is
    /// final, frees it, and returns its failure (`None`: it was done).
    fn release(&self, id: Id) -> Option<EngineError>;
    fn notify(&self, peer: &Peer, message: &[u8]) -> Result<(), EngineError>;
    fn notifications(&self, into: &mut Vec<Notification>) -> Result<(), EngineError>;
    /// A descriptor that polls readable when notifications may wait.
    fn notification_fd(&self) -> std::os::fd::BorrowedFd<'_>;
    /// Notifications dropped because they named a sender other than the
    /// key they came with.
    fn forged_notifications(&self) -> u64;
}

/// A transport, its table of transfers and the thread that drives them.
pub(crate) struct Driven<T: Transport + Send + 'static> {
    shared: Arc<Shared<T>>,
    driver: Option<JoinHandle<()>>,
}

impl<T: Transport + Send + 'static> Driven<T> {
    /// Starts the driver over `transport`, with the notification inbox
    /// bound on `notify_host` and guarded by `guard`.
    pub(crate) fn start(
        transport: T,
        notify_host: &str,
        guard: &tensorferry_zmq::Guard,
    ) -> Result<Self, EngineError> {
        let wake = transport.wake_fd();
        let shared = Arc::new(Shared {
            plane: Mutex::new(Plane {
                transport,
                regions: Vec::new(),
            }),
            table: Mutex::new(Table::default()),
            finished: Condvar::new(),
            waiters: std::sync::atomic::AtomicUsize::new(0),
            notifier: Notifier::bind(notify_host, guard)?,
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let driver = std::thread::Builder::new()
            .name("ferry-engine".into())
            .spawn(move || drive(&s, wake))
            .map_err(|e| EngineError::Transport {
                verb: "start the engine's driver thread",
                message: e.to_string(),
                kind: FaultKind::Io,
            })?;
        Ok(Self {
            shared,
            driver: Some(driver),
        })
    }
}

impl<T: Transport + Send + 'static> Drop for Driven<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }
}

fn drive<T: Transport>(shared: &Shared<T>, wake: Option<std::os::fd::RawFd>) {
    while !shared.stop.load(Ordering::Acquire) {
        shared.collect();
        shared.notifier.flush();
        shared.notifier.serve();
        shared.notifier.sweep();
        let mut chores = Chores::default();
        let now = Instant::now();
        let next = {
            let mut t = lock(&shared.table);
            t.expire(now, &mut chores);
            t.next_deadline()
        };
        shared.run(chores);
        let wait = next.map_or(TICK, |d| d.saturating_duration_since(now).min(TICK));
        match wake {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // At least a millisecond: a zero wait with a deadline
                // just past would spin.
                let ms = wait.as_millis().clamp(1, TICK.as_millis()) as i32;
                // SAFETY: one pollfd we own; the descriptor lives as long
                // as the transport, which outlives this thread.
                unsafe { libc::poll(&mut p, 1, ms) };
            }
            None => std::thread::sleep(wait.max(Duration::from_millis(1))),
        }
    }
}

impl<T: Transport + Send + 'static> Driver for Driven<T> {
    fn session_id(&self) -> String {
        self.shared.session_id()
    }

    unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError> {
        let size = usize::try_from(len).map_err(|_| EngineError::Transport {
            verb: "register",
            message: format!("{len} bytes do not fit this machine's address space"),
            kind: FaultKind::Registration,
        })?;
        let mut p = lock(&self.shared.plane);
        // SAFETY: the caller's contract (the memory stays mapped while
        // registered and may be written by peers).
        let region = unsafe { p.transport.register(addr as usize as *mut u8, size) }
            .map_err(|e| EngineError::transport("register", T::fault_kind(&e), &e))?;
        p.regions.push(region);
        Ok(())
    }

    fn deregister(&self, addr: u64) -> Result<(), EngineError> {
        let region = lock(&self.shared.plane)
            .regions
            .iter()
            .find(|r| r.addr == addr)
            .copied()
            .ok_or(EngineError::NotRegistered { addr })?;
        // Transfers whose operations may still use the memory end first
        // (by their deadline and the grace; past it, the memory stays
        // registered, in use). The plane's lock is not held meanwhile:
        // their completions come through it.
        {
            let mut t = lock(&self.shared.table);
            while let Some((id, limit)) = t.touching(region.addr, region.len) {
                let now = Instant::now();
                if now >= limit {
                    let (pending, total) = t.pending(id).unwrap_or_default();
                    return Err(EngineError::NotEnded {
                        session: t.session(id).unwrap_or_default(),
                        pending,
                        total,
                        grace: super::END_GRACE,
                    });
                }
                t = self.shared.wait_finished(t, limit - now);
            }
        }
        let mut p = lock(&self.shared.plane);
        let at = p
            .regions
            .iter()
            .position(|r| r.addr == addr)
            .ok_or(EngineError::NotRegistered { addr })?;
        // Forgotten only once the data plane let it go, so that a failed
        // deregistration can be tried again.
        let region = p.regions[at];
        p.transport
            .deregister(region)
            .map_err(|e| EngineError::transport("deregister", T::fault_kind(&e), &e))?;
        p.regions.remove(at);
        Ok(())
    }

    fn post(
        &self,
        direction: Direction,
        peer: Arc<Peer>,
        ops: &[Op],
        deadline: Instant,
        notify: Option<Vec<u8>>,
    ) -> Result<Id, EngineError> {
        if let Some(m) = &notify {
            notify::check_len(m.len())?;
            let Some(to) = &peer.notify else {
                return Err(no_endpoint(&peer).to_error(&peer.session));
            };
            // Connected here, in the poster's thread, so that the thread
            // that sends it when the transfer ends never waits to connect.
            self.shared.notifier.reach(to)?;
        }
        let total = ops.iter().filter(|o| o.len > 0).count();
        let total = u32::try_from(total).map_err(|_| EngineError::Transport {
            verb: "post a transfer",
            message: format!(
                "{total} operations in one transfer; the most is {}",
                u32::MAX
            ),
            kind: FaultKind::TooLarge,
        })?;
        let span = ops
            .iter()
            .filter(|o| o.len > 0)
            .fold((u64::MAX, 0u64), |(lo, hi), o| {
                let at = direction.local(o);
                (lo.min(at), hi.max(at.saturating_add(o.len)))
            });
        let id = lock(&self.shared.table).open(Arc::clone(&peer), span, total, deadline, notify);
        let mut posted = 0u32;
        let mut refused: Option<EngineError> = None;
        {
            let mut p = lock(&self.shared.plane);
            // Every local range is checked before any is posted, so that a
            // bad one refuses the transfer whole.
            if let Some(bad) = ops
                .iter()
                .filter(|o| o.len > 0)
                .find(|o| p.region_of(direction.local(o), o.len).is_none())
            {
                refused = Some(direction.outside_own(direction.local(bad), bad.len).into());
            } else {
                let cookie = id.cookie();
                for op in ops.iter().filter(|o| o.len > 0) {
                    let Some(region) = p.region_of(direction.local(op), op.len) else {
                        break;
                    };
                    let offset = direction.local(op) - region.addr;
                    let outcome = match direction {
                        Direction::Write => p.transport.post_write(&WriteOp {
                            region,
                            local_offset: offset,
                            len: op.len,
                            dest_session: &peer.plane,
                            dest_addr: op.dst,
                            // The engine's data planes are opened
                            // delivery-complete (no receiver counts tags),
                            // so the cookie serves.
                            tag: WriteTag(cookie),
                            cookie,
                        }),
                        Direction::Read => p.transport.post_read(&ReadOp {
                            region,
                            local_offset: offset,
                            len: op.len,
                            src_session: &peer.plane,
                            src_addr: op.src,
                            cookie,
                        }),
                    };
                    match outcome {
                        Ok(()) => posted += 1,
                        Err(e) => {
                            refused = Some(EngineError::transport(
                                post_verb(direction),
                                T::fault_kind(&e),
                                &e,
                            ));
                            break;
                        }
                    }
                }
            }
        }
        let mut chores = Chores::default();
        let result = {
            let mut t = lock(&self.shared.table);
            match refused {
                // Nothing of it moves: refused whole, and gone.
                Some(e) if posted == 0 => {
                    let f = Failure::Op {
                        verb: post_verb(direction),
                        kind: e.kind(),
                        message: e.to_string(),
                    };
                    t.posted(id, 0, Some(f), &mut chores);
                    t.release(id);
                    chores.finished = false;
                    Err(e)
                }
                Some(e) => {
                    let f = Failure::Op {
                        verb: post_verb(direction),
                        kind: e.kind(),
                        message: e.to_string(),
                    };
                    t.posted(id, posted, Some(f), &mut chores);
                    Ok(id)
                }
                None => {
                    t.posted(id, posted, None, &mut chores);
                    Ok(id)
                }
            }
        };
        self.shared.run(chores);
        // What completes at once (a data plane that makes its operations
        // when polled) is found here, without waiting for the driver.
        self.shared.collect();
        result
    }

    fn state(&self, id: Id) -> Option<TransferState> {
        self.shared.collect();
        let mut chores = Chores::default();
        let state = {
            let mut t = lock(&self.shared.table);
            t.expire(Instant::now(), &mut chores);
            t.state(id)
        };
        if chores.end.is_empty() && chores.send.is_empty() && !chores.finished {
            return state;
        }
        self.shared.run(chores);
        lock(&self.shared.table).state(id)
    }

    fn wait(&self, id: Id, until: Option<Instant>) -> Option<TransferState> {
        let shared = &self.shared;
        let mut t = lock(&shared.table);
        // Never past the transfer's deadline and the grace to end it.
        let limit = t.limit(id, None)?;
        let until = Some(until.map_or(limit, |u| u.min(limit)));
        loop {
            match t.state(id)? {
                TransferState::Pending => {}
                final_state => return Some(final_state),
            }
            let now = Instant::now();
            // Deadlines are kept here too, not only at the driver's tick.
            let mut chores = Chores::default();
            t.expire(now, &mut chores);
            if !chores.end.is_empty() || !chores.send.is_empty() {
                drop(t);
                shared.run(chores);
                t = lock(&shared.table);
                continue;
            }
            if until.is_some_and(|u| now >= u) {
                return Some(TransferState::Pending);
            }
            let mut wake = now + TICK;
            if let Some(d) = t.next_deadline() {
                wake = wake.min(d);
            }
            if let Some(u) = until {
                wake = wake.min(u);
            }
            t = shared.wait_finished(t, wake.saturating_duration_since(now));
        }
    }

    fn failure(&self, id: Id) -> Option<EngineError> {
        lock(&self.shared.table).failure(id)
    }

    fn release(&self, id: Id) -> Option<EngineError> {
        let mut chores = Chores::default();
        let limit = {
            let mut t = lock(&self.shared.table);
            t.end(id, false, &mut chores);
            t.limit(id, Some(Instant::now()))
        };
        self.shared.run(chores);
        // Final only once every operation of it ended: until then bytes of
        // it may move. Waited for until its limit; past it, the caller is
        // told, and the transfer is freed when its operations end (their
        // memory stays in use meanwhile: the data plane refuses to
        // deregister it).
        let mut t = lock(&self.shared.table);
        while t.state(id) == Some(TransferState::Pending) {
            let now = Instant::now();
            if limit.is_some_and(|l| now >= l) {
                let (pending, total) = t.pending(id).unwrap_or_default();
                let session = t.session(id).unwrap_or_default();
                t.release(id);
                return Some(EngineError::NotEnded {
                    session,
                    pending,
                    total,
                    grace: super::END_GRACE,
                });
            }
            t = self.shared.wait_finished(t, TICK);
        }
        let failure = t.failure(id);
        t.release(id);
        failure
    }

    fn notify(&self, peer: &Peer, message: &[u8]) -> Result<(), EngineError> {
        let Some(to) = &peer.notify else {
            return Err(no_endpoint(peer).to_error(&peer.session));
        };
        let from = self.shared.session_id();
        let until = Instant::now() + notify::NOTIFY_WAIT;
        self.shared.notifier.send(&from, to, message, Some(until))
    }

    fn notifications(&self, into: &mut Vec<Notification>) -> Result<(), EngineError> {
        self.shared.notifier.take(into)
    }

    fn notification_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor is the inbox's poll, owned by the
        // notifier in `shared`, which lives at least as long as `self`.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.shared.notifier.ready_fd()) }
    }

    fn forged_notifications(&self) -> u64 {
        self.shared.notifier.forged()
    }
}
