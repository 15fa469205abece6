//! The engine over a data plane's `Transport` (every backend's): the
//! transport behind a lock, a thread that drives it (so that a process
//! that only receives still answers peers, and completions are found
//! without a caller), and callers that post their writes, collect what has
//! completed themselves (a data plane that completes at the next poll
//! costs no thread hop), and wait for their own writes' completions.
// Registering memory with a transport is unsafe by its contract.
#![allow(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_core::transport::{Fault, FaultKind, Region, Transport, WriteOp, WriteTag};

use super::{EngineError, Op};

/// Longest wait on the transport's wake descriptor between checks of the
/// stop flag (it also bounds how late a timed-out write is noticed).
const TICK: Duration = Duration::from_millis(5);

/// How often a transport without a wake descriptor is polled.
const POLL: Duration = Duration::from_millis(1);

/// What the engine needs of a posting data plane.
pub(crate) trait Posted: Send + Sync {
    fn session_id(&self) -> String;
    /// # Safety
    /// As [`super::TransferEngine::register`].
    unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError>;
    fn deregister(&self, addr: u64) -> Result<(), EngineError>;
    fn write(&self, session: &str, ops: &[Op], timeout: Duration) -> Result<(), EngineError>;
}

type Outcome = Result<(), (FaultKind, String)>;

#[derive(Default)]
struct Done {
    /// Writes some caller waits for.
    waiting: HashSet<u64>,
    /// Their outcomes, until taken.
    results: HashMap<u64, Outcome>,
}

struct Shared<T> {
    transport: Mutex<T>,
    regions: Mutex<Vec<Region>>,
    done: Mutex<Done>,
    finished: Condvar,
    next_cookie: AtomicU64,
    stop: AtomicBool,
}

fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A posting transport and the thread that drives it.
pub(crate) struct Driven<T: Transport + Send + 'static> {
    shared: Arc<Shared<T>>,
    driver: Option<JoinHandle<()>>,
}

impl<T: Transport + Send + 'static> Driven<T> {
    /// Starts the driver over `transport`.
    pub(crate) fn start(transport: T) -> Result<Self, EngineError> {
        let wake = transport.wake_fd();
        let shared = Arc::new(Shared {
            transport: Mutex::new(transport),
            regions: Mutex::new(Vec::new()),
            done: Mutex::new(Done::default()),
            finished: Condvar::new(),
            next_cookie: AtomicU64::new(1),
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
    let mut got = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        shared.collect(&mut got);
        match wake {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd we own; the descriptor lives as long
                // as the transport, which outlives this thread.
                unsafe { libc::poll(&mut p, 1, TICK.as_millis() as i32) };
            }
            None => std::thread::sleep(POLL),
        }
    }
}

impl<T: Transport> Shared<T> {
    /// Polls the transport and hands what completed to the writers that
    /// wait for it (`got` is scratch space, left empty).
    fn collect(&self, got: &mut Vec<(u64, Outcome)>) {
        {
            let mut t = lock(&self.transport);
            while let Some(c) = t.poll_completion() {
                got.push((c.cookie, c.result.map_err(|e| (e.kind(), e.to_string()))));
            }
            // Delivery-complete writes: arrivals are not counted.
            while t.poll_landed().is_some() {}
        }
        if !got.is_empty() {
            let mut done = lock(&self.done);
            for (cookie, outcome) in got.drain(..) {
                if done.waiting.remove(&cookie) {
                    done.results.insert(cookie, outcome);
                }
            }
            drop(done);
            self.finished.notify_all();
        }
    }
}

impl<T: Transport + Send + 'static> Posted for Driven<T> {
    fn session_id(&self) -> String {
        lock(&self.shared.transport).session_id().to_owned()
    }

    unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError> {
        let size = usize::try_from(len).map_err(|_| EngineError::Transport {
            verb: "register",
            message: format!("{len} bytes do not fit this machine's address space"),
            kind: FaultKind::Registration,
        })?;
        let mut regions = lock(&self.shared.regions);
        // SAFETY: the caller's contract (the memory stays mapped while
        // registered and may be written by peers).
        let region =
            unsafe { lock(&self.shared.transport).register(addr as usize as *mut u8, size) }
                .map_err(|e| EngineError::transport("register", &e))?;
        regions.push(region);
        Ok(())
    }

    fn deregister(&self, addr: u64) -> Result<(), EngineError> {
        let mut regions = lock(&self.shared.regions);
        let at = regions
            .iter()
            .position(|r| r.addr == addr)
            .ok_or(EngineError::NotRegistered { addr })?;
        let region = regions.remove(at);
        lock(&self.shared.transport)
            .deregister(region)
            .map_err(|e| EngineError::transport("deregister", &e))
    }

    fn write(&self, session: &str, ops: &[Op], timeout: Duration) -> Result<(), EngineError> {
        let mut writes = Vec::with_capacity(ops.len());
        {
            let regions = lock(&self.shared.regions);
            for op in ops.iter().filter(|o| o.len > 0) {
                let region = regions
                    .iter()
                    .find(|r| {
                        op.src >= r.addr
                            && op
                                .src
                                .checked_add(op.len)
                                .is_some_and(|end| end <= r.addr + r.len)
                    })
                    .ok_or(EngineError::SourceOutOfBounds {
                        addr: op.src,
                        len: op.len,
                    })?;
                let cookie = self.shared.next_cookie.fetch_add(1, Ordering::Relaxed);
                writes.push((*region, *op, cookie));
            }
        }
        lock(&self.shared.done)
            .waiting
            .extend(writes.iter().map(|w| w.2));
        let mut posted = Vec::with_capacity(writes.len());
        let mut refused = None;
        {
            let mut t = lock(&self.shared.transport);
            for (region, op, cookie) in &writes {
                let w = WriteOp {
                    region: *region,
                    local_offset: op.src - region.addr,
                    len: op.len,
                    dest_session: session,
                    dest_addr: op.dst,
                    // The engine's data planes are opened delivery-complete
                    // (no receiver counts tags), so the cookie names the
                    // write: hashing the session id per write cost more than
                    // a small write's copy.
                    tag: WriteTag(*cookie),
                    cookie: *cookie,
                };
                match t.post_write(&w) {
                    Ok(()) => posted.push(*cookie),
                    Err(e) => {
                        refused = Some(EngineError::transport("post a write", &e));
                        break;
                    }
                }
            }
        }
        // What completes at once (a data plane that makes its writes when
        // polled) is found here, without waiting for the driver.
        self.shared.collect(&mut Vec::new());
        // Wait for every posted write, even after a refusal or past the
        // timeout: the caller must not reuse memory a write may still
        // read, nor its peer memory a write may still fill. Past the
        // timeout the transport ends the writes (`cancel_transfers`), and
        // their completions, final by the seam's contract, end the wait.
        let start = Instant::now();
        let mut first_error = refused;
        let mut remaining: HashSet<u64> = posted.iter().copied().collect();
        let mut timed_out = None;
        let mut done = lock(&self.shared.done);
        // Posting stops at the first refusal: what was not posted is the
        // tail.
        for (_, _, cookie) in &writes[posted.len()..] {
            done.waiting.remove(cookie);
        }
        loop {
            remaining.retain(|c| match done.results.remove(c) {
                Some(Ok(())) => false,
                Some(Err((kind, message))) => {
                    first_error.get_or_insert(EngineError::Transport {
                        verb: "write",
                        message,
                        kind,
                    });
                    false
                }
                None => true,
            });
            if remaining.is_empty() {
                break;
            }
            let waited = start.elapsed();
            if timed_out.is_none() && waited >= timeout {
                timed_out = Some((remaining.len(), waited));
                drop(done);
                self.end_writes(session);
                done = lock(&self.shared.done);
                continue;
            }
            let wait = match timed_out {
                // Ended: their completions are on their way.
                Some(_) => TICK,
                None => timeout - waited,
            };
            done = self
                .shared
                .finished
                .wait_timeout(done, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        match (timed_out, first_error) {
            (Some((pending, waited)), Some(_)) => Err(EngineError::Timeout {
                session: session.to_owned(),
                pending,
                total: writes.len(),
                waited,
            }),
            // Every write finished after all, by the time it was ended.
            (_, None) => Ok(()),
            (None, Some(e)) => Err(e),
        }
    }
}

impl<T: Transport + Send + 'static> Driven<T> {
    /// Has the transport end the writes to `session` it still runs, so
    /// that their completions come; should it fail to, the writes may
    /// still move, and the caller goes on waiting for them (said in the
    /// log, since it may be long).
    fn end_writes(&self, session: &str) {
        if let Err(e) = lock(&self.shared.transport).cancel_transfers(session) {
            tracing::error!(
                peer = session,
                error = %e,
                "cannot end the writes of a timed-out transfer; waiting for them to finish before returning"
            );
        }
        self.shared.collect(&mut Vec::new());
    }
}
