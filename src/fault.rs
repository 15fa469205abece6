//! Fault injection around real backends, as smoltcp's `FaultInjector` does
//! around a device: wrap any [`Transport`] or [`ControlChannel`] and it
//! fails, drops, duplicates and delays on a seeded schedule, so that tests
//! exercise the failure paths with real sockets and real shared memory.
//!
//! Faults are drawn from a seeded generator: a failing run is replayed by
//! its seed.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Capabilities, ChannelEvent, Completion, ControlChannel, ControlRecv, FaultKind, Incoming,
    Landed, PoolOwner, ReadOp, Region, Transport, WriteOp, WriteTag,
};

/// What faults to inject: the core's plan, which the simulation's faulty
/// wire reads too. These wrappers apply its message faults (`drop`,
/// `duplicate`, `delay_message`, `jitter`) where messages arrive and its
/// write faults (`fail_write`, `delay_write` held back by `delay`,
/// `lose_notice`) to the wrapped transport, on the wall clock; the
/// simulation's alone (`crash`, `crash_after_write`, `late_notice`,
/// `write_lifetime`) are ignored here.
pub use tensorferry_core::fault_plan::FaultPlan;

/// A small deterministic generator (xorshift64*).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// A number in `[0, 1)`.
    fn fraction(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.fraction() < p
    }

    /// A time in `[0, up_to)`; none drawn (so the schedule is as without
    /// it) where `up_to` is zero.
    fn below(&mut self, up_to: Duration) -> Duration {
        if up_to.is_zero() {
            Duration::ZERO
        } else {
            up_to.mul_f64(self.fraction())
        }
    }
}

/// An injected fault, or the wrapped backend's own error.
#[derive(Debug, thiserror::Error)]
pub enum FaultError<E: std::error::Error + 'static> {
    /// A write the plan chose to fail.
    #[error("injected write failure")]
    Injected,
    /// The backend's error.
    #[error(transparent)]
    Inner(#[from] E),
}

/// Arrival notices between the faulty transports of one process, standing
/// in for a data plane whose receivers learn of arrivals (as libfabric's
/// remote CQ data): a sender's transport posts each write whose completion
/// it reaps (on a data plane whose completions mean delivery, its bytes
/// are there) to its receiver's session, unless its plan loses the notice;
/// the receiver's transport reports them from `poll_landed`.
#[derive(Clone, Debug, Default)]
pub struct Notices(Arc<Mutex<HashMap<String, VecDeque<Landed>>>>);

impl Notices {
    fn post(&self, session: &str, landed: Landed) {
        let mut boards = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        boards
            .entry(session.to_owned())
            .or_default()
            .push_back(landed);
    }

    fn take(&self, session: &str) -> Option<Landed> {
        let mut boards = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        boards.get_mut(session)?.pop_front()
    }
}

/// A transport whose writes fail or complete late on schedule.
#[derive(Debug)]
pub struct FaultyTransport<T: Transport>
where
    T::Error: 'static,
{
    inner: T,
    plan: FaultPlan,
    rng: Rng,
    held: VecDeque<(Instant, Completion<FaultError<T::Error>>)>,
    notices: Option<Notices>,
    /// Writes posted, by cookie, while notices are kept: their receiver's
    /// session and tag.
    posted: HashMap<u64, (String, WriteTag)>,
    /// Writes failed on purpose so far.
    pub injected: u64,
}

impl<T: Transport> FaultyTransport<T>
where
    T::Error: 'static,
{
    /// Wraps `inner`.
    pub fn new(inner: T, plan: FaultPlan) -> Self {
        Self {
            inner,
            rng: Rng::new(plan.seed),
            plan,
            held: VecDeque::new(),
            notices: None,
            posted: HashMap::new(),
            injected: 0,
        }
    }

    /// Wraps `inner` as a data plane whose completions do not mean
    /// delivery: its receivers take transfers only once `notices` (shared
    /// with the senders' transports) says their writes landed.
    pub fn with_notices(inner: T, plan: FaultPlan, notices: Notices) -> Self {
        Self {
            notices: Some(notices),
            ..Self::new(inner, plan)
        }
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }
}

impl<T: Transport> Transport for FaultyTransport<T>
where
    T::Error: 'static,
{
    type Error = FaultError<T::Error>;

    fn fault_kind(error: &Self::Error) -> FaultKind {
        match error {
            FaultError::Injected => FaultKind::Io,
            FaultError::Inner(e) => T::fault_kind(e),
        }
    }

    fn session_id(&self) -> &str {
        self.inner.session_id()
    }

    #[allow(unsafe_code)]
    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, Self::Error> {
        // SAFETY: the caller's contract is passed on unchanged.
        Ok(unsafe { self.inner.register(addr, len) }?)
    }

    fn deregister(&mut self, region: Region) -> Result<(), Self::Error> {
        Ok(self.inner.deregister(region)?)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), Self::Error> {
        if self.rng.chance(self.plan.fail_write) {
            self.injected += 1;
            self.held.push_back((
                Instant::now(),
                Completion {
                    cookie: write.cookie,
                    result: Err(FaultError::Injected),
                },
            ));
            return Ok(());
        }
        self.inner.post_write(write)?;
        if self.notices.is_some() {
            self.posted
                .insert(write.cookie, (write.dest_session.to_owned(), write.tag));
        }
        Ok(())
    }

    /// Passed on as it is: the plan's faults are the writes' (ferry's
    /// nodes never read).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), Self::Error> {
        Ok(self.inner.post_read(read)?)
    }

    fn poll_completion(&mut self) -> Option<Completion<Self::Error>> {
        while let Some(c) = self.inner.poll_completion() {
            if let (Some(notices), Some((session, tag))) =
                (&self.notices, self.posted.remove(&c.cookie))
            {
                // Decided by the tag, so that a run replays by its seed.
                let lost = Rng::new(self.plan.seed ^ tag.0).chance(self.plan.lose_notice);
                if c.result.is_ok() && !lost {
                    notices.post(&session, Landed::of(tag));
                }
            }
            let due = if self.rng.chance(self.plan.delay_write) {
                Instant::now() + self.plan.delay
            } else {
                Instant::now()
            };
            self.held.push_back((
                due,
                Completion {
                    cookie: c.cookie,
                    result: c.result.map_err(FaultError::Inner),
                },
            ));
        }
        let now = Instant::now();
        let i = self.held.iter().position(|(due, _)| *due <= now)?;
        self.held.remove(i).map(|(_, c)| c)
    }

    /// Ends the wrapped transport's writes to the peer; the completions
    /// this wrapper holds back (delayed or injected) are of writes that
    /// already ended, and are released as planned.
    fn cancel_transfers(&mut self, dest_session: &str) -> Result<(), Self::Error> {
        Ok(self.inner.cancel_transfers(dest_session)?)
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = self.inner.capabilities();
        if self.notices.is_some() {
            c.delivery_complete = false;
        }
        c
    }

    // Delayed completions are released by the caller's polling, so the
    // wrapped transport's descriptor is not offered (`wake_fd`'s default).

    fn poll_landed(&mut self) -> Option<Landed> {
        match &self.notices {
            Some(notices) => notices.take(self.inner.session_id()),
            None => self.inner.poll_landed(),
        }
    }
}

// SAFETY: the wrapper owns the transport it forwards to (`inner`, never
// moved out: `inner()` lends it shared only) and adds no way to unmap its
// pool, so `T`'s promise holds for as long as the wrapper lives.
#[allow(unsafe_code)]
unsafe impl<T: Transport + PoolOwner> PoolOwner for FaultyTransport<T> {
    fn pool_ptr(&self) -> *mut u8 {
        self.inner.pool_ptr()
    }

    fn pool_len(&self) -> usize {
        self.inner.pool_len()
    }
}

/// A control channel whose received messages are dropped, duplicated or
/// delayed on schedule.
#[derive(Debug)]
pub struct FaultyChannel<C> {
    inner: C,
    plan: FaultPlan,
}

impl<C: ControlChannel> FaultyChannel<C> {
    /// Wraps `inner`. Sends go straight through: faults are injected where
    /// messages arrive.
    pub fn new(inner: C, plan: FaultPlan) -> Self {
        Self { inner, plan }
    }
}

impl<C: ControlChannel> ControlChannel for FaultyChannel<C> {
    type Sender = C::Sender;
    type Receiver = FaultyReceiver<C::Receiver>;

    fn split(self) -> (C::Sender, FaultyReceiver<C::Receiver>) {
        let (tx, rx) = self.inner.split();
        (
            tx,
            FaultyReceiver {
                inner: rx,
                rng: Rng::new(self.plan.seed ^ 0x5eed),
                plan: self.plan,
                held: VecDeque::new(),
                current: Held::default(),
                dropped: 0,
            },
        )
    }
}

#[derive(Clone, Debug, Default)]
struct Held {
    from: String,
    via: String,
    user: String,
    magic: Vec<u8>,
    payload: Vec<u8>,
}

/// The receiving side of a [`FaultyChannel`].
#[derive(Debug)]
pub struct FaultyReceiver<R> {
    inner: R,
    plan: FaultPlan,
    rng: Rng,
    held: VecDeque<(Instant, Held)>,
    current: Held,
    /// Messages dropped on purpose so far.
    pub dropped: u64,
}

impl<R: ControlRecv> ControlRecv for FaultyReceiver<R> {
    type Error = R::Error;

    fn fault_kind(error: &R::Error) -> FaultKind {
        R::fault_kind(error)
    }

    fn local_endpoint(&self) -> &str {
        self.inner.local_endpoint()
    }

    fn recv<'b>(
        &'b mut self,
        buf: &'b mut [u8],
        wait: Duration,
        wake: Option<c_int>,
    ) -> Result<Option<ChannelEvent<'b>>, R::Error> {
        let deadline = Instant::now() + wait;
        loop {
            let now = Instant::now();
            if let Some(i) = self.held.iter().position(|(due, _)| *due <= now) {
                if let Some((_, h)) = self.held.remove(i) {
                    self.current = h;
                    return Ok(Some(ChannelEvent::Message(Incoming {
                        from: &self.current.from,
                        via: &self.current.via,
                        user: &self.current.user,
                        magic: &self.current.magic,
                        payload: &self.current.payload,
                    })));
                }
            }
            // Wait no longer than the next held message is due.
            let next_due = self.held.iter().map(|(d, _)| *d).min();
            let until = next_due.map_or(deadline, |d| d.min(deadline));
            let left = until.saturating_duration_since(now);
            let got = match self.inner.recv(buf, left, wake)? {
                None => None,
                Some(ChannelEvent::Gone { from }) => Some(Err(from.to_owned())),
                Some(ChannelEvent::Message(m)) => Some(Ok(Held {
                    from: m.from.to_owned(),
                    via: m.via.to_owned(),
                    user: m.user.to_owned(),
                    magic: m.magic.to_vec(),
                    payload: m.payload.to_vec(),
                })),
            };
            match got {
                None if Instant::now() >= deadline => return Ok(None),
                // Woken (or bounded by a channel that cannot watch the
                // descriptor) before anything held is due.
                None if wake.is_some() && Instant::now() < until => return Ok(None),
                None => continue,
                Some(Err(from)) => {
                    self.current.from = from;
                    return Ok(Some(ChannelEvent::Gone {
                        from: &self.current.from,
                    }));
                }
                Some(Ok(h)) => {
                    if self.rng.chance(self.plan.drop) {
                        self.dropped += 1;
                        continue;
                    }
                    let now = Instant::now();
                    if self.rng.chance(self.plan.duplicate) {
                        let due = now + self.rng.below(self.plan.jitter);
                        self.held.push_back((due, h.clone()));
                    }
                    let held = if self.rng.chance(self.plan.delay_message) {
                        self.plan.delay
                    } else {
                        Duration::ZERO
                    };
                    let due = now + held + self.rng.below(self.plan.jitter);
                    self.held.push_back((due, h));
                }
            }
        }
    }
}
