//! What the application's threads and the progress thread share: the
//! state machine and its queues under one lock, the turn that fires
//! timers, queues what the machine sends and routes its events, and the
//! sending of that queue, in order, after the lock is let go.

use std::sync::TryLockError;

use super::*;

/// The control channel's sending side, whatever its type, so that the
/// node types name no channel. Sending allocates nothing; only a failure
/// boxes its error.
pub(super) trait DynSend: Send {
    fn send_parts(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), SendFailure>;
}

/// A failed send: its kind, and the channel's own error.
pub(super) struct SendFailure {
    pub(super) kind: FaultKind,
    pub(super) source: Box<dyn std::error::Error + Send + Sync>,
}

impl<S> DynSend for S
where
    S: ControlSend + Send,
    S::Error: Send + Sync + 'static,
{
    fn send_parts(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), SendFailure> {
        ControlSend::send(self, to, parts).map_err(|e| SendFailure {
            kind: <S as ControlSend>::fault_kind(&e),
            source: Box::new(e),
        })
    }
}

/// The control channel's sending side, where it sends, and the buffer a
/// message is taken into to be sent.
pub(super) struct Sender {
    pub(super) tx: Box<dyn DynSend>,
    pub(super) to: String,
    pub(super) buf: Vec<u8>,
}

/// Messages the machine produced, encoded, waiting to be sent: a turn of
/// the machine queues them under the state's lock, and whoever sends
/// takes them in order into its own buffer and sends them without it.
/// Back to back in one buffer, made at start: queueing allocates only
/// when more is waiting than ever before.
pub(super) struct Outbox {
    /// The messages, back to back from `start`.
    bytes: Vec<u8>,
    start: usize,
    /// Their lengths, in order.
    lens: VecDeque<usize>,
}

impl Outbox {
    pub(super) fn with_capacity(messages: usize, bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            start: 0,
            lens: VecDeque::with_capacity(messages),
        }
    }

    fn push(&mut self, msg: &[u8]) {
        if self.start > 0 && self.bytes.len() + msg.len() > self.bytes.capacity() {
            // The room of what was taken, before growing.
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        self.bytes.extend_from_slice(msg);
        self.lens.push_back(msg.len());
    }

    /// Moves the next message into `into`; false if there is none.
    fn take(&mut self, into: &mut Vec<u8>) -> bool {
        let Some(n) = self.lens.pop_front() else {
            return false;
        };
        into.clear();
        into.extend_from_slice(&self.bytes[self.start..self.start + n]);
        self.start += n;
        if self.lens.is_empty() {
            self.clear();
        }
        true
    }

    /// Drops what is queued.
    fn clear(&mut self) {
        self.bytes.clear();
        self.start = 0;
        self.lens.clear();
    }

    fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
}

pub(super) struct State {
    pub(super) machine: Instance<'static>,
    /// Encoding buffer for outgoing messages.
    pub(super) out: Vec<u8>,
    /// What the machine sent, waiting for the sender.
    pub(super) outbox: Outbox,
    /// Transfers received, with when they arrived.
    pub(super) received: VecDeque<(Token, Arrival)>,
    pub(super) outcomes: VecDeque<Outcome>,
    /// Metadata buffers for deliveries, reused.
    pub(super) meta_free: Vec<Vec<u8>>,
    /// Non-transfer messages for the application.
    pub(super) frames: VecDeque<Frame>,
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Taken to send, never while holding `state` (a send may block for
    /// the channel's send timeout; the state's other users go on).
    pub(super) sender: Mutex<Sender>,
    pub(super) changed: Condvar,
    /// Counts the turns that routed an event to the application (bumped
    /// with each wake of `changed`), so that a waiting call can watch for
    /// one without the lock while it spins ([`spin`](Self::spin)).
    pub(super) events: AtomicU64,
    pub(super) stop: AtomicBool,
    /// The progress thread panicked: the machine may be half-way through
    /// a message, so no new view of the pool is made from it.
    pub(super) dead: AtomicBool,
    pub(super) probe: Arc<InstanceProbe>,
    pub(super) clock: Clock,
    pub(super) memory: PoolMemory,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the front of the queue `queue` picks out of the state,
    /// waiting at most `timeout` for one to arrive.
    pub(super) fn next<T>(
        &self,
        timeout: Duration,
        queue: fn(&mut State) -> &mut VecDeque<T>,
    ) -> Option<T> {
        let seen = self.events.load(Ordering::Acquire);
        if let Some(t) = queue(&mut self.lock()).pop_front() {
            return Some(t);
        }
        self.spin(seen, timeout);
        let (mut st, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |s| queue(s).is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        queue(&mut st).pop_front()
    }

    /// Spins (yielding the core between looks) until a turn routes an
    /// event after `seen` was read from `events`, for at most [`SPIN`] and
    /// `timeout`: a reply usually comes within that, and a sleeping
    /// thread's wake costs more than the looks (a context switch, and on
    /// an idle core its way out of the idle state). It stops as soon as
    /// a yield lets another thread run: the core is shared, and the
    /// looks would delay that thread.
    pub(super) fn spin(&self, seen: u64, timeout: Duration) {
        let start = std::time::Instant::now();
        let budget = timeout.min(SPIN);
        while self.events.load(Ordering::Acquire) == seen
            && !self.stop.load(Ordering::Relaxed)
            && start.elapsed() < budget
        {
            let t0 = std::time::Instant::now();
            std::thread::yield_now();
            if t0.elapsed() >= SHARED_CORE {
                // Another thread took the core: spinning would take its
                // turns (perhaps the progress thread's) rather than save
                // a wake.
                return;
            }
        }
    }

    /// Wakes the application's waiting calls: after the state's lock is
    /// let go, so that a woken thread does not wake only to wait for it.
    pub(super) fn wake(&self) {
        self.events.fetch_add(1, Ordering::Release);
        self.changed.notify_all();
    }

    /// Fires due timers, queues the messages the machine sends, and routes
    /// events; true if an event was routed, and the caller then
    /// [`wake`](Self::wake)s the application once it let the lock go. The
    /// caller sends the queue once it let the lock go
    /// ([`drive_and_send`](Self::drive_and_send)).
    #[must_use = "a routed event wakes the application (`wake`) once the lock is let go"]
    pub(super) fn drive(&self, st: &mut State, now: Instant) -> bool {
        let State {
            machine,
            out,
            outbox,
            received,
            outcomes,
            ..
        } = st;
        if machine.poll_timeout().is_some_and(|t| t <= now) {
            machine.handle_timeout(now);
        }
        while let Some(r) = machine.poll_transmit(out) {
            match r {
                Ok(n) => outbox.push(&out[..n]),
                Err(e) => out.resize(e.needed, 0),
            }
        }
        let mut woke = false;
        while let Some(e) = machine.poll_event() {
            woke = true;
            match e {
                InstanceEvent::Registered => {
                    info!(coordinator = %machine.coordinator(), "registered");
                }
                InstanceEvent::Refused => {
                    warn!(coordinator = %machine.coordinator(), "registration refused");
                }
                InstanceEvent::Received(t) => {
                    Metrics::add(&self.probe.metrics.received, 1);
                    received.push_back((t, Arrival::now()));
                }
                InstanceEvent::Sent { id, timing } => {
                    self.probe.sent(&timing);
                    Metrics::add(&self.probe.metrics.sent, 1);
                    debug!(%id, "sent");
                    push_bounded(
                        outcomes,
                        Outcome {
                            id,
                            sent: true,
                            reason: Reason::EMPTY,
                        },
                    );
                }
                InstanceEvent::SendFailed { id, reason } => {
                    Metrics::add(&self.probe.metrics.send_failed, 1);
                    info!(%id, %reason, "send failed");
                    push_bounded(
                        outcomes,
                        Outcome {
                            id,
                            sent: false,
                            reason,
                        },
                    );
                }
                InstanceEvent::Aborted(t) => {
                    // The application sees it on the delivery
                    // (`Delivery::is_aborted`); its release still frees
                    // the slot.
                    Metrics::add(&self.probe.metrics.aborted, 1);
                    if let Some(rx) = machine.received(t) {
                        info!(id = rx.id, "a held transfer was aborted by the coordinator");
                    }
                }
            }
        }
        let gauges = InstanceGauges {
            requests_held: machine.requests_held() as u64,
            prealloc_in_use: machine.prealloc_in_use() as u64,
            prealloc_slots: machine.prealloc_slots().len() as u64,
            live_slots: machine.pool().stats().live_slots,
        };
        self.probe.set_state(gauges, *machine.stats());
        woke
    }

    /// [`drive`](Self::drive), then, with the lock let go, wakes the
    /// application if an event came and sends what it queued.
    pub(super) fn drive_and_send(&self, mut st: MutexGuard<'_, State>, now: Instant) {
        let woke = self.drive(&mut st, now);
        drop(st);
        if woke {
            self.wake();
        }
        self.send_queued();
    }

    /// The coordinator is gone: the machine decides what that means (it
    /// registers anew if it was answered), and what the outbox holds from
    /// a conversation the machine ended goes too.
    pub(super) fn coordinator_lost(&self, st: &mut State, now: Instant) {
        let conversation = st.machine.conversation();
        st.machine.handle_coordinator_lost(now);
        forget_outbox(st, conversation);
    }

    /// A peer's connection closed: the machine decides whether it was the
    /// coordinator (true), and the outbox goes as in
    /// [`coordinator_lost`](Self::coordinator_lost).
    pub(super) fn peer_gone(&self, st: &mut State, now: Instant, from: &str) -> bool {
        let conversation = st.machine.conversation();
        let lost = st.machine.handle_gone(now, from);
        forget_outbox(st, conversation);
        lost
    }

    /// Sends the queued messages, in order, on this thread, unless another
    /// thread is sending: that one sends these too before it stops, so a
    /// call never waits behind another thread's send.
    pub(super) fn send_queued(&self) {
        loop {
            let mut sender = match self.sender.try_lock() {
                Ok(s) => s,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            let lost = self.send_pending(&mut sender);
            drop(sender);
            if lost {
                self.lost_by_send();
            }
            // Whatever a thread queued while this one held the sender, and
            // so left to it, is sent by this one.
            if self.lock().outbox.is_empty() {
                return;
            }
        }
    }

    /// Waits for the sender (another thread's send included), sends what
    /// is queued, then runs `f` with it: on return, every message queued
    /// before the call went to the channel, ahead of what `f` sends.
    pub(super) fn with_sender<R>(&self, f: impl FnOnce(&mut Sender) -> R) -> R {
        let mut sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let lost = self.send_pending(&mut sender);
        let r = f(&mut sender);
        drop(sender);
        if lost {
            self.lost_by_send();
        }
        self.send_queued();
        r
    }

    /// Sends the outbox, message by message, taking the state's lock only
    /// to take each one; true if a send found the coordinator gone.
    fn send_pending(&self, sender: &mut Sender) -> bool {
        let m = &self.probe.metrics;
        let mut lost = false;
        loop {
            // Its own statement, so that the lock is let go before the send.
            let taken = self.lock().outbox.take(&mut sender.buf);
            if !taken {
                return lost;
            }
            match sender
                .tx
                .send_parts(&sender.to, &[TRANSFER_MAGIC, &sender.buf])
            {
                Ok(()) => Metrics::add(&m.messages_out, 1),
                Err(e) => {
                    Metrics::add(&m.send_errors, 1);
                    warn!(coordinator = %sender.to, error = %e.source, "control send failed");
                    lost |= e.kind == FaultKind::PeerGone;
                }
            }
        }
    }

    /// A send found the coordinator gone.
    fn lost_by_send(&self) {
        let mut st = self.lock();
        let now = self.clock.now();
        self.coordinator_lost(&mut st, now);
        let woke = self.drive(&mut st, now);
        drop(st);
        if woke {
            self.wake();
        }
    }
}

/// Messages polled under `conversation`, which the machine ended, are
/// not sent ([`Instance::conversation`]).
fn forget_outbox(st: &mut State, conversation: u64) {
    if st.machine.conversation() != conversation {
        st.outbox.clear();
    }
}

/// When a transfer reached this node: on the wall clock for the
/// application, on the monotonic one for its hold time.
#[derive(Clone, Copy, Debug)]
pub(super) struct Arrival {
    pub(super) wall: SystemTime,
    pub(super) at: std::time::Instant,
}

impl Arrival {
    pub(super) fn now() -> Self {
        Self {
            wall: SystemTime::now(),
            at: std::time::Instant::now(),
        }
    }
}

/// Keeps the newest outcomes when the application does not read them.
pub(super) fn push_bounded(q: &mut VecDeque<Outcome>, o: Outcome) {
    if q.len() == q.capacity() {
        q.pop_front();
    }
    q.push_back(o);
}
