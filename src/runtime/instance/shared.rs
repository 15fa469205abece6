//! What the application's threads and the progress thread share: the
//! state machine and its queues under one lock, and the turn that fires
//! timers, sends what the machine queued and routes its events.

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
            kind: e.kind(),
            source: Box::new(e),
        })
    }
}

pub(super) struct State {
    pub(super) machine: Instance<'static>,
    pub(super) tx: Box<dyn DynSend>,
    pub(super) coordinator: String,
    /// Encoding buffer for outgoing messages.
    pub(super) out: Vec<u8>,
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
    pub(super) changed: Condvar,
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

    /// Fires due timers, sends queued messages, and routes events.
    pub(super) fn drive(&self, st: &mut State, now: Instant) {
        let State {
            machine,
            tx,
            coordinator,
            out,
            received,
            outcomes,
            ..
        } = st;
        if machine.poll_timeout().is_some_and(|t| t <= now) {
            machine.handle_timeout(now);
        }
        let mut lost = false;
        while let Some(r) = machine.poll_transmit(out) {
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    out.resize(e.needed, 0);
                    continue;
                }
            };
            match tx.send_parts(coordinator, &[TRANSFER_MAGIC, &out[..n]]) {
                Ok(()) => Metrics::add(&self.probe.metrics.messages_out, 1),
                Err(e) => {
                    Metrics::add(&self.probe.metrics.send_errors, 1);
                    warn!(coordinator = %coordinator, error = %e.source, "control send failed");
                    lost |= e.kind == FaultKind::PeerGone;
                }
            }
        }
        if lost {
            machine.handle_coordinator_lost(now);
        }
        let mut woke = false;
        while let Some(e) = machine.poll_event() {
            woke = true;
            match e {
                InstanceEvent::Registered => {
                    info!(coordinator = %coordinator, "registered");
                }
                InstanceEvent::Refused => {
                    warn!(coordinator = %coordinator, "registration refused");
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
        if woke {
            self.changed.notify_all();
        }
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
