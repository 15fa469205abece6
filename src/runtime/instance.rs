//! An instance node: ferry-core's `Instance` driven over a control channel
//! and a data plane, with the API a serving runtime calls.
//!
//! One progress thread receives control messages, hands them to the state
//! machine and posts the writes it asks for (outside the lock, so that a
//! large copy does not stall the application). Application threads stage,
//! commit, receive and release through the same state machine under a
//! mutex, and send what that produces at once: a commit goes out on the
//! caller's thread without waiting for the progress thread.
//!
//! In steady state nothing here allocates: buffers, queues and the
//! per-delivery metadata buffers are made at start and reused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use ferry_core::handshake::instance::{
    Head, Instance, InstanceConfig, InstanceEvent, InstanceStats, InstanceStorage, Registration,
    Token,
};
use ferry_core::handshake::{Instant, Limits, Reason, RequestId};
use ferry_core::json::{JsonStr, RawJson};
use ferry_core::slots::{layout, BuddyConfig, Dtype, TensorSpec};
use ferry_core::transport::{
    ControlChannel, ControlRecv, ControlSend, Fault, FaultKind, Transport,
};
use ferry_core::wire::{Manifest, Shape, ShapeIter, TensorEntry, TRANSFER_MAGIC};
use tracing::{debug, info, warn};

use super::clock::Clock;
use super::error::NodeError;
use super::memory::{PoolMemory, PoolOwner};
use super::metrics::{Metrics, MetricsSnapshot};
use super::progress::Progress;
use super::telemetry::{InstanceGauges, InstanceProbe};

/// Most tensors one request carries.
pub const MAX_TENSORS: usize = 32;

/// An instance's settings.
#[derive(Clone, Debug)]
pub struct InstanceSettings {
    /// The role it registers as (`encoder`, `denoiser`, ...).
    pub role: String,
    /// The coordinator's endpoint.
    pub coordinator: String,
    /// The smallest slot of the pool allocator (a power of two).
    pub min_block: u64,
    /// Receive slots set aside at start: how many, of what size.
    pub prealloc: (usize, u64),
    /// Table sizes.
    pub limits: Limits,
    /// Resend `transfer_register` this often until acknowledged.
    pub register_retry: Duration,
    /// Staged, waiting for `transfer_push`, before the slot is freed; must
    /// exceed the coordinator's queue plus alloc timeouts.
    pub staged_timeout: Duration,
    /// Slot reserved, waiting for `transfer_ready`; must exceed the
    /// coordinator's push timeout.
    pub reserved_timeout: Duration,
    /// How long a slot a write may still be landing in stays out of use.
    pub quarantine: Duration,
    /// On data planes whose completions do not mean delivery: how long a
    /// transfer announced ready may wait for its write's arrival notices
    /// before it is refused (`transfer_done` with an error).
    pub landing_timeout: Duration,
    /// Which coordinator this instance serves under ([`Head`]).
    pub head: Head,
    /// Under [`Head::Sglang`]: how long a `transfer_alloc` without room is
    /// held before the head is told it failed.
    pub alloc_hold: Duration,
}

/// sglang's head's only timeout by default (`--disagg-timeout`).
pub const SGLANG_HEAD_TIMEOUT: Duration = Duration::from_secs(600);

impl InstanceSettings {
    /// Settings with ferry's defaults for `role`, reporting to
    /// `coordinator`.
    pub fn new(role: &str, coordinator: &str) -> Self {
        Self {
            role: role.to_owned(),
            coordinator: coordinator.to_owned(),
            min_block: 1 << 20,
            prealloc: (0, 0),
            limits: Limits::INSTANCE,
            register_retry: Duration::from_millis(200),
            staged_timeout: Duration::from_secs(60),
            reserved_timeout: Duration::from_secs(20),
            quarantine: Duration::from_secs(1),
            landing_timeout: Duration::from_secs(10),
            head: Head::Ferry,
            alloc_hold: Duration::from_secs(20),
        }
    }

    /// These settings for serving under sglang's head, whose only timeout
    /// (`--disagg-timeout`) is `head_timeout` ([`SGLANG_HEAD_TIMEOUT`] by
    /// default): that head tells no instance when it gives up, so nothing
    /// here gives up first. A staged slot waits for its push, a reserved
    /// one for its ready, and an ALLOC without room for room, as long as
    /// the head may still use them, and a little longer.
    pub fn under_sglang(mut self, head_timeout: Duration) -> Self {
        let beyond = head_timeout + head_timeout / 10 + Duration::from_secs(1);
        self.head = Head::Sglang;
        self.staged_timeout = beyond;
        self.reserved_timeout = beyond;
        self.alloc_hold = head_timeout;
        self
    }
}

/// What became of a request this instance staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The request.
    pub id: RequestId,
    /// True if its bytes reached the receiver.
    pub sent: bool,
    /// Why it did not (the coordinator's abort reason, the write's error,
    /// a local timeout); empty when sent.
    pub reason: Reason,
}

/// A message on the control channel that is not a transfer message (sglang
/// sends work items on the same sockets), as it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Frame 0.
    pub magic: Vec<u8>,
    /// Frame 1.
    pub payload: Vec<u8>,
}

impl Frame {
    /// Frame 0 as text: the request id, in a work item sglang's head
    /// dispatches to an encoder (`[request_id, pickled Req list]`).
    pub fn request_id(&self) -> Option<&str> {
        std::str::from_utf8(&self.magic)
            .ok()
            .filter(|id| !id.is_empty())
    }
}

/// Frames kept for the application before the oldest are dropped.
pub(super) const FRAMES: usize = 1024;

/// A node's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStats {
    /// The runtime's counters.
    pub metrics: MetricsSnapshot,
    /// The state machine's counters.
    pub instance: InstanceStats,
    /// Requests held (any state, quarantined slots included).
    pub requests_held: usize,
    /// Preallocated slots in use.
    pub prealloc_in_use: usize,
    /// Pool slots allocated (preallocated slots included).
    pub live_slots: u64,
    /// Preallocated receive slots.
    pub prealloc_slots: usize,
}

/// The control channel's sending side, whatever its type, so that the
/// node types name no channel. Sending allocates nothing; only a failure
/// boxes its error.
trait DynSend: Send {
    fn send_parts(&mut self, to: &str, parts: &[&[u8]]) -> Result<(), SendFailure>;
}

/// A failed send: its kind, and the channel's own error.
struct SendFailure {
    kind: FaultKind,
    source: Box<dyn std::error::Error + Send + Sync>,
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

/// The node's state under its one lock.
pub(super) struct State {
    pub(super) machine: Instance<'static>,
    tx: Box<dyn DynSend>,
    pub(super) coordinator: String,
    /// Encoding buffer for outgoing messages.
    out: Vec<u8>,
    /// Transfers received, with when they arrived.
    received: VecDeque<(Token, Arrival)>,
    outcomes: VecDeque<Outcome>,
    /// Metadata buffers for deliveries, reused.
    meta_free: Vec<Vec<u8>>,
    /// Non-transfer messages for the application.
    pub(super) frames: VecDeque<Frame>,
}

/// What the application's threads and the progress thread share.
pub(super) struct Shared {
    state: Mutex<State>,
    pub(super) changed: Condvar,
    pub(super) stop: AtomicBool,
    pub(super) probe: Arc<InstanceProbe>,
    pub(super) clock: Clock,
    memory: PoolMemory,
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
struct Arrival {
    wall: SystemTime,
    at: std::time::Instant,
}

impl Arrival {
    fn now() -> Self {
        Self {
            wall: SystemTime::now(),
            at: std::time::Instant::now(),
        }
    }
}

/// Keeps the newest outcomes when the application does not read them.
fn push_bounded(q: &mut VecDeque<Outcome>, o: Outcome) {
    if q.len() == q.capacity() {
        q.pop_front();
    }
    q.push_back(o);
}

/// A running instance.
pub struct InstanceNode {
    shared: Arc<Shared>,
    /// The progress thread; it hands back what it owned (the transport,
    /// and so the pool) for the node's drop to release.
    thread: Option<JoinHandle<Box<dyn Send>>>,
    session: String,
    endpoint: String,
}

impl std::fmt::Debug for InstanceNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceNode")
            .field("session", &self.session)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl InstanceNode {
    /// Starts an instance over `transport`, whose own pool the node
    /// receives into and stages in, talking over `channel`. The node keeps
    /// the transport (on its progress thread) until it is dropped, so the
    /// pool outlives every view of it.
    pub fn start<T, C>(
        settings: &InstanceSettings,
        transport: T,
        channel: C,
    ) -> Result<Self, NodeError>
    where
        T: Transport + PoolOwner + Send + 'static,
        T::Error: Send + Sync + 'static,
        C: ControlChannel,
        C::Sender: 'static,
        <C::Sender as ControlSend>::Error: Send + Sync + 'static,
        C::Receiver: 'static,
    {
        let mut transport = transport;
        if transport.pool_len() == 0 || transport.pool_ptr().is_null() {
            return Err(NodeError::NoPool);
        }
        // SAFETY: `PoolOwner`'s contract: the range stays mapped while
        // `transport` lives, wherever it moves. It moves into the progress
        // thread, which hands it back to `Drop for InstanceNode` (even when
        // the loop panics), after every view of the pool, each borrowing
        // the node, has ended.
        #[allow(unsafe_code)]
        let memory = unsafe { PoolMemory::new(transport.pool_ptr(), transport.pool_len()) };
        let transport_err = |verb| {
            move |e: T::Error| NodeError::Transport {
                verb,
                source: Box::new(e),
            }
        };
        // SAFETY: the memory stays mapped while the transport lives (as
        // above), and the transport is dropped with the registration; the
        // node expects peers to write into its receive slots, and hands
        // out views only of slots no peer writes (`PoolMemory`'s callers).
        #[allow(unsafe_code)]
        let region = unsafe { transport.register(memory.base(), memory.len()) }
            .map_err(transport_err("register"))?;
        let (tx, rx) = channel.split();
        let session = transport.session_id().to_owned();
        // Where a completion does not mean delivery, the core holds each
        // received transfer until the data plane says its bytes landed.
        let landing =
            (!transport.capabilities().delivery_complete).then_some(settings.landing_timeout);
        let endpoint = rx.local_endpoint().to_owned();
        let pool = BuddyConfig {
            pool_size: memory.len() as u64,
            min_block: settings.min_block,
            pool_id: 0,
        };
        settings.limits.check()?;
        let storage = InstanceStorage::owned(&settings.limits, &pool, settings.prealloc.0)
            .map_err(NodeError::Pool)?;
        let clock = Clock::start();
        let config = InstanceConfig {
            role: &settings.role,
            session_id: &session,
            work_endpoint: &endpoint,
            pool_ptr: memory.base() as u64,
            pool,
            prealloc: settings.prealloc,
            register_retry: settings.register_retry,
            staged_timeout: settings.staged_timeout,
            reserved_timeout: settings.reserved_timeout,
            quarantine: settings.quarantine,
            landing,
            head: settings.head,
            alloc_hold: settings.alloc_hold,
        };
        let machine = Instance::new(clock.now(), config, storage)?;
        let n = settings.limits.requests.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                machine,
                tx: Box::new(tx),
                coordinator: settings.coordinator.clone(),
                out: vec![0; 64 * 1024],
                received: VecDeque::with_capacity(n),
                outcomes: VecDeque::with_capacity(4 * n),
                meta_free: (0..n)
                    .map(|_| Vec::with_capacity(settings.limits.nested_per_request))
                    .collect(),
                frames: VecDeque::new(),
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            probe: Arc::new(InstanceProbe::new(&settings.role)),
            clock,
            memory,
        });
        let progress = Progress::new(Arc::clone(&shared), transport, region, rx, n);
        let thread = std::thread::Builder::new()
            .name(format!("ferry-{}", settings.role))
            .spawn(move || {
                let mut progress = progress;
                // A panic must not drop the transport, and so unmap the
                // pool, while the application may hold views of it: the
                // loop's unwinding stops here and the transport goes back
                // to the node's drop.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| progress.run()));
                if ran.is_err() {
                    tracing::error!(
                        "the progress thread panicked; this node makes no more progress"
                    );
                }
                Box::new(progress) as Box<dyn Send>
            })
            .map_err(NodeError::Thread)?;
        {
            let mut st = shared.lock();
            shared.drive(&mut st, shared.clock.now());
        }
        Ok(Self {
            shared,
            thread: Some(thread),
            session,
            endpoint,
        })
    }

    /// The data-plane session id peers write to.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// The control endpoint the coordinator sends to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Waits until the coordinator acknowledged the registration (under
    /// sglang's head, which never does: until it is sent).
    pub fn wait_registered(&self, timeout: Duration) -> Result<(), NodeError> {
        let st = self.shared.lock();
        let (st, _) = self
            .shared
            .changed
            .wait_timeout_while(st, timeout, |s| {
                s.machine.registration() == Registration::Pending
            })
            .unwrap_or_else(PoisonError::into_inner);
        match st.machine.registration() {
            Registration::Accepted | Registration::Sent => Ok(()),
            Registration::Refused => Err(NodeError::Refused {
                reason: match st.machine.refusal() {
                    "" => "no reason given".to_owned(),
                    why => why.to_owned(),
                },
            }),
            Registration::Pending => Err(NodeError::NotRegistered(timeout)),
        }
    }

    /// True while the coordinator has acknowledged this instance.
    pub fn is_registered(&self) -> bool {
        self.shared.lock().machine.is_registered()
    }

    /// Takes no new work from now on, while what is in flight goes on to
    /// its end ([`Instance::drain`](ferry_core::handshake::instance::Instance::drain)):
    /// [`stage`](Self::stage) is refused with
    /// [`InstanceError::Draining`](ferry_core::handshake::instance::InstanceError::Draining),
    /// new allocations are refused, and ferry's coordinator stops sending
    /// work here. Keep receiving and releasing until
    /// [`is_drained`](Self::is_drained) (or a grace period ends), then
    /// [`leave`](Self::leave).
    pub fn drain(&self) {
        let mut st = self.shared.lock();
        let now = self.shared.clock.now();
        st.machine.drain(now);
        self.shared.drive(&mut st, now);
    }

    /// Requests still in progress here, on either side (slots sitting out
    /// a quarantine not counted).
    pub fn in_flight(&self) -> usize {
        self.shared.lock().machine.in_flight()
    }

    /// True once a drain is over: nothing in progress here, and ferry's
    /// coordinator said nothing more is addressed to this instance
    /// ([`Instance::is_drained`](ferry_core::handshake::instance::Instance::is_drained)).
    pub fn is_drained(&self) -> bool {
        self.shared.lock().machine.is_drained()
    }

    /// Ends this instance's part in everything, for `reason`
    /// ([`Instance::leave`](ferry_core::handshake::instance::Instance::leave)):
    /// what is still held fails; writes still posted are let finish (each
    /// reported as usual), and then the coordinator and the peers are told
    /// the instance is gone. Waits up to `timeout` for that (the data
    /// plane ends every write within its write timeout); true if it came.
    /// The message is handed to the control channel before this returns,
    /// and dropping the node closes the channel, which waits for it to go
    /// out. Transfers the application still holds are marked aborted;
    /// release them as usual.
    pub fn leave(&self, reason: &str, timeout: Duration) -> bool {
        let mut st = self.shared.lock();
        let now = self.shared.clock.now();
        st.machine.leave(now, reason);
        self.shared.drive(&mut st, now);
        let end = std::time::Instant::now() + timeout;
        while !st.machine.has_left() {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            // Completions come on the progress thread, which drives (and
            // so sends) under this lock; a completion of an aborted write
            // wakes no one, hence the short waits.
            st = self
                .shared
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(10)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Reserves a slot for request `id` laid out for `tensors` (each at a
    /// 512-byte boundary). Fill the tensors, then
    /// [`commit`](Staging::commit); dropping the staging gives the slot
    /// back.
    pub fn stage<'a>(
        &self,
        id: &str,
        tensors: &[TensorSpec<'a>],
    ) -> Result<Staging<'_, 'a>, NodeError> {
        if tensors.len() > MAX_TENSORS {
            return Err(NodeError::TooManyTensors {
                count: tensors.len(),
                max: MAX_TENSORS,
            });
        }
        let mut entries = [EMPTY_ENTRY; MAX_TENSORS];
        let l = layout(tensors, &mut entries).map_err(NodeError::Layout)?;
        let (token, offset) = {
            let mut st = self.shared.lock();
            st.machine.stage(id, l.data_size)?
        };
        Ok(Staging {
            node: self,
            token: Some(token),
            offset,
            data_size: l.data_size,
            entries,
            count: l.tensors,
        })
    }

    /// The next transfer received, waiting at most `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<Delivery<'_>> {
        let mut st = self.shared.lock();
        loop {
            let (guard, _) = self
                .shared
                .changed
                .wait_timeout_while(st, timeout, |s| {
                    s.received.is_empty() && !self.shared.stop.load(Ordering::Relaxed)
                })
                .unwrap_or_else(PoisonError::into_inner);
            st = guard;
            let (token, arrived) = st.received.pop_front()?;
            let mut meta = st.meta_free.pop().unwrap_or_default();
            meta.clear();
            let view = st.machine.received(token).map(|rx| {
                meta.extend_from_slice(rx.id.as_bytes());
                let id_len = rx.id.len();
                let manifest = match rx.manifest {
                    Manifest::Raw(raw) => raw.as_str(),
                    Manifest::Entries(_) => "{}",
                };
                meta.extend_from_slice(manifest.as_bytes());
                meta.extend_from_slice(rx.scalar_fields.as_str().as_bytes());
                (id_len, manifest.len(), rx.slot_offset, rx.slot_size)
            });
            match view {
                Some((id_len, manifest_len, slot_offset, slot_size)) => {
                    return Some(Delivery {
                        node: self,
                        token: Some(token),
                        arrived,
                        meta,
                        id_len,
                        manifest_len,
                        slot_offset,
                        slot_size,
                    });
                }
                None => st.meta_free.push(meta),
            }
        }
    }

    /// The next outcome of a request this instance staged, waiting at most
    /// `timeout`.
    pub fn next_outcome(&self, timeout: Duration) -> Option<Outcome> {
        let st = self.shared.lock();
        let (mut st, _) = self
            .shared
            .changed
            .wait_timeout_while(st, timeout, |s| s.outcomes.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        st.outcomes.pop_front()
    }

    /// The next message that was not a transfer message (a work item of
    /// the application), waiting at most `timeout`. The newest 1,024 are
    /// kept.
    pub fn next_frame(&self, timeout: Duration) -> Option<Frame> {
        let st = self.shared.lock();
        let (mut st, _) = self
            .shared
            .changed
            .wait_timeout_while(st, timeout, |s| s.frames.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        st.frames.pop_front()
    }

    /// What this node measures (counters, gauges, latencies), readable
    /// from any thread while it runs and served to Prometheus by adding it
    /// to a [`Telemetry`](super::telemetry::Telemetry).
    pub fn probe(&self) -> &Arc<InstanceProbe> {
        &self.shared.probe
    }

    /// Figures now.
    pub fn stats(&self) -> NodeStats {
        let st = self.shared.lock();
        let m = &st.machine;
        NodeStats {
            metrics: self.shared.probe.metrics.snapshot(),
            instance: *m.stats(),
            requests_held: m.requests_held(),
            prealloc_in_use: m.prealloc_in_use(),
            live_slots: m.pool().stats().live_slots,
            prealloc_slots: m.prealloc_slots().len(),
        }
    }

    fn release(&self, token: Token, error: Option<&str>, meta: Vec<u8>, arrived: Arrival) {
        let mut st = self.shared.lock();
        st.meta_free.push(meta);
        if let Err(e) = st.machine.release(token, error) {
            debug!(error = %e, "release of a transfer no longer held");
            return;
        }
        self.shared.probe.hold.observe(arrived.at.elapsed());
        Metrics::add(&self.shared.probe.metrics.released, 1);
        self.shared.drive(&mut st, self.shared.clock.now());
    }
}

impl InstanceNode {
    /// Sends the application's own message, `frames` as one multipart, to
    /// the coordinator on the protocol's socket: sglang's decoder returns
    /// its output to the head this way (a JSON descriptor frame, then the
    /// tensors' bytes).
    pub fn send_frames(&self, frames: &[&[u8]]) -> Result<(), NodeError> {
        let mut st = self.shared.lock();
        let State {
            tx, coordinator, ..
        } = &mut *st;
        match tx.send_parts(coordinator, frames) {
            Ok(()) => {
                Metrics::add(&self.shared.probe.metrics.messages_out, 1);
                Ok(())
            }
            Err(e) => {
                Metrics::add(&self.shared.probe.metrics.send_errors, 1);
                Err(NodeError::Send {
                    to: coordinator.clone(),
                    source: e.source,
                })
            }
        }
    }
}

impl Drop for InstanceNode {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            // Dropped here, after every view of the pool (each borrows the
            // node) has ended.
            let kept = t.join();
            drop(kept);
        }
    }
}

const EMPTY_ENTRY: TensorEntry<'static> = TensorEntry {
    field: JsonStr::plain(""),
    list_index: None,
    offset: 0,
    shape: Shape::Dims(&[]),
    dtype: JsonStr::plain(""),
};

/// A request being staged: its slot, to fill before committing.
pub struct Staging<'n, 'a> {
    node: &'n InstanceNode,
    token: Option<Token>,
    offset: u64,
    data_size: u64,
    entries: [TensorEntry<'a>; MAX_TENSORS],
    count: usize,
}

impl Staging<'_, '_> {
    /// Bytes the slot's data takes (alignment padding included).
    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    /// The bytes of tensor `i`, in the order given to `stage`.
    pub fn tensor_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let e = self.entries[..self.count].get(i)?;
        let len = ferry_core::slots::entry_bytes(e)?;
        self.node
            .shared
            .memory
            .staged_mut(self.offset + e.offset, len)
    }

    /// Announces the filled slot to the coordinator, with `scalar_fields`
    /// (a JSON object) relayed to the receiver.
    pub fn commit(mut self, scalar_fields: &str) -> Result<(), NodeError> {
        let scalars = RawJson::parse_object(scalar_fields).map_err(NodeError::ScalarFields)?;
        let Some(token) = self.token else {
            return Ok(());
        };
        let shared = &self.node.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        let manifest = Manifest::Entries(&self.entries[..self.count]);
        st.machine
            .commit(now, token, self.data_size, &manifest, scalars)?;
        self.token = None;
        Metrics::add(&shared.probe.metrics.staged, 1);
        shared.drive(&mut st, now);
        Ok(())
    }
}

impl Staging<'_, '_> {
    /// Announces the filled slot as the next leg of `delivery` (the same
    /// request, received by this node) and releases the delivery, at once:
    /// under sglang's head in its one message,
    /// `transfer_done{staged_for_decoder}`, which that head needs from a
    /// denoiser; under ferry's coordinator as `transfer_staged` then
    /// `transfer_done`.
    ///
    /// On an error the delivery is failed with its text (its slot freed,
    /// the coordinator told) and the staged slot given back.
    pub fn forward(mut self, delivery: Delivery<'_>, scalar_fields: &str) -> Result<(), NodeError> {
        let mut delivery = delivery;
        let result = self.forward_inner(&mut delivery, scalar_fields);
        if let Err(e) = &result {
            delivery.fail(&e.to_string());
        }
        result
    }

    fn forward_inner(
        &mut self,
        delivery: &mut Delivery<'_>,
        scalar_fields: &str,
    ) -> Result<(), NodeError> {
        if !std::ptr::eq(self.node, delivery.node) {
            // Its token would name a request of another machine.
            return Err(NodeError::ForeignDelivery);
        }
        let scalars = RawJson::parse_object(scalar_fields).map_err(NodeError::ScalarFields)?;
        let (Some(token), Some(received)) = (self.token, delivery.token) else {
            return Err(NodeError::Instance(
                ferry_core::handshake::instance::InstanceError::StaleToken,
            ));
        };
        let shared = &self.node.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        let manifest = Manifest::Entries(&self.entries[..self.count]);
        st.machine
            .forward(now, received, token, self.data_size, &manifest, scalars)?;
        self.token = None;
        delivery.token = None;
        st.meta_free.push(std::mem::take(&mut delivery.meta));
        shared.probe.hold.observe(delivery.arrived.at.elapsed());
        Metrics::add(&shared.probe.metrics.staged, 1);
        Metrics::add(&shared.probe.metrics.released, 1);
        shared.drive(&mut st, now);
        Ok(())
    }
}

impl Drop for Staging<'_, '_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let _ = self.node.shared.lock().machine.unstage(token);
        }
    }
}

/// One tensor of a delivery.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'d> {
    /// The request field it belongs to.
    pub field: JsonStr<'d>,
    /// Position in the field's list, for list-valued fields.
    pub list_index: Option<u64>,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Shape<'d>,
    /// The tensor's bytes in the slot.
    pub bytes: &'d [u8],
}

impl TensorView<'_> {
    /// The dimensions.
    pub fn dims(&self) -> ShapeIter<'_> {
        self.shape.dims()
    }
}

/// A received transfer the application holds; its slot is freed (and
/// `transfer_done` sent) on [`release`](Self::release), [`fail`](Self::fail)
/// or drop.
pub struct Delivery<'n> {
    node: &'n InstanceNode,
    token: Option<Token>,
    arrived: Arrival,
    meta: Vec<u8>,
    id_len: usize,
    manifest_len: usize,
    slot_offset: u64,
    slot_size: u64,
}

impl Delivery<'_> {
    fn text(&self, start: usize, len: usize) -> &str {
        // Copied from validated JSON text and an id held as a str.
        std::str::from_utf8(&self.meta[start..start + len]).unwrap_or("")
    }

    /// When the transfer reached this node (its `transfer_ready` was
    /// accepted), on the wall clock so that it compares across processes.
    pub fn arrived(&self) -> SystemTime {
        self.arrived.wall
    }

    /// The request id.
    pub fn id(&self) -> &str {
        self.text(0, self.id_len)
    }

    /// The manifest as received (checked against the slot).
    pub fn manifest(&self) -> Manifest<'_> {
        let raw = RawJson::parse_object(self.text(self.id_len, self.manifest_len))
            .unwrap_or(RawJson::EMPTY_OBJECT);
        Manifest::Raw(raw)
    }

    /// The scalar fields relayed from the sender (a JSON object).
    pub fn scalar_fields(&self) -> &str {
        let start = self.id_len + self.manifest_len;
        self.text(start, self.meta.len() - start)
    }

    /// The whole slot.
    pub fn slot(&self) -> &[u8] {
        self.node
            .shared
            .memory
            .delivered(self.slot_offset, self.slot_size)
            .unwrap_or(&[])
    }

    /// The tensors, in manifest order. Every entry was checked to lie in
    /// the slot before the transfer was delivered.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        let slot = self.slot();
        let manifest = self.manifest();
        manifest.iter().filter_map(move |e| {
            let e = e.ok()?;
            let len = ferry_core::slots::entry_bytes(&e)?;
            let mut name = [0u8; 32];
            let dtype = Dtype::from_name(e.dtype.unescape_into(&mut name).ok()?).ok()?;
            let start = usize::try_from(e.offset).ok()?;
            let bytes = slot.get(start..start.checked_add(usize::try_from(len).ok()?)?)?;
            Some(TensorView {
                field: e.field,
                list_index: e.list_index,
                dtype,
                shape: e.shape,
                bytes,
            })
        })
    }

    /// True if the coordinator aborted the request since it arrived
    /// (it timed out, or the coordinator was lost): its result is not
    /// wanted. Release it all the same.
    pub fn is_aborted(&self) -> bool {
        let Some(token) = self.token else {
            return false;
        };
        let st = self.node.shared.lock();
        st.machine.received(token).is_some_and(|rx| rx.aborted)
    }

    /// Done with it: the slot is freed and the coordinator told.
    pub fn release(mut self) {
        self.finish(None);
    }

    /// Done with it, but it could not be used: `reason` goes to the
    /// coordinator in `transfer_done.error` (cut at
    /// [`REASON_LEN`](ferry_core::handshake::REASON_LEN) bytes).
    pub fn fail(mut self, reason: &str) {
        self.finish(Some(reason));
    }

    fn finish(&mut self, error: Option<&str>) {
        if let Some(token) = self.token.take() {
            let meta = std::mem::take(&mut self.meta);
            self.node.release(token, error, meta, self.arrived);
        }
    }
}

impl Drop for Delivery<'_> {
    fn drop(&mut self) {
        self.finish(None);
    }
}
