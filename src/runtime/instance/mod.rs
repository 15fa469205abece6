//! An instance node: tensorferry-core's `Instance` driven over a control channel
//! and a data plane, with the API a serving runtime calls.
//!
//! One progress thread receives control messages, hands them to the state
//! machine and posts the writes it asks for (outside the lock, so that a
//! large copy does not stall the application). Application threads stage,
//! commit, receive and release through the same state machine under a
//! mutex, and send what that produces as soon as they let it go: a commit
//! goes out on the caller's thread without waiting for the progress
//! thread. Messages are sent outside the state's lock, one thread at a
//! time and in the order the machine made them, so that a send that
//! blocks (a coordinator that stopped reading, up to the channel's send
//! timeout) holds up no other thread's call.
//!
//! In steady state nothing here allocates: buffers, queues and the
//! per-delivery metadata buffers are made at start and reused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use tensorferry_core::handshake::instance::{
    Instance, InstanceConfig, InstanceEvent, InstanceIdentity, InstanceStats, InstanceStorage,
    InstanceUnhandled, Registration, Token, Write,
};
use tensorferry_core::handshake::{Instant, Limits, Reason, RequestId};
use tensorferry_core::json::{JsonStr, RawJson};
use tensorferry_core::slots::{layout, Dtype, TensorSpec};
use tensorferry_core::transport::{
    ChannelEvent, ControlRecv, ControlSend, FaultKind, Landed, Region, Transport, WriteOp,
};
use tensorferry_core::wire::{Manifest, Shape, ShapeIter, TensorEntry, TRANSFER_MAGIC};
use tracing::{debug, debug_span, info, warn};

use super::clock::Clock;
use super::error::NodeError;
use super::memory::PoolMemory;
use super::metrics::{Metrics, MetricsSnapshot};
use super::telemetry::{InstanceGauges, InstanceProbe};
use super::InstanceChannel;
use tensorferry_core::transport::PoolOwner;

mod config;
mod delivery;
mod progress;
mod shared;
mod staging;
#[cfg(test)]
mod tests;

pub use config::{GuardError, InstanceNodeConfig};
pub use delivery::{Delivery, TensorView};
use progress::Progress;
use shared::{Arrival, Outbox, Sender, Shared, State};
pub use staging::Staging;
use staging::EMPTY_ENTRY;

/// Most tensors one request carries.
pub const MAX_TENSORS: usize = 32;

/// Longest wait of the progress thread between checks of its stop flag.
const MAX_WAIT: Duration = Duration::from_millis(20);

/// How often pending writes are polled for when the transport offers no
/// wake descriptor.
const POLL_WRITES: Duration = Duration::from_micros(100);

/// How long a call that waits for the progress thread (a delivery, an
/// outcome) spins before it sleeps: about a hand-off's few control
/// messages on one host, so that the usual answer is taken without a
/// sleep and a wake.
const SPIN: Duration = Duration::from_micros(50);

/// A yield that takes this long ran another thread on the core.
const SHARED_CORE: Duration = Duration::from_micros(5);

/// Receive buffer for one control message.
const RECV_BUF: usize = 1 << 20;

/// Room made at start for the messages waiting to be sent (a message is
/// some hundred bytes, a manifest's a few KiB).
const OUTBOX_BYTES: usize = 64 * 1024;

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
const FRAMES: usize = 1024;

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

/// A running instance.
pub struct InstanceNode {
    shared: Arc<Shared>,
    /// The progress thread; it hands back what it owned (the transport,
    /// and so the pool) for the node's drop to release.
    thread: Option<JoinHandle<Box<dyn Send>>>,
    session: String,
    endpoint: String,
    /// The quarantine the machine runs with (see [`Self::quarantine`]).
    quarantine: Duration,
}

debug_naming!(InstanceNode, |n| { "session": n.session, "endpoint": n.endpoint });

impl InstanceNode {
    /// Starts an instance over `transport`, whose own pool the node
    /// receives into and stages in, talking over `channel`. The node keeps
    /// the transport (on its progress thread) until it is dropped, so the
    /// pool outlives every view of it. A transport that owns no pool
    /// starts with [`start_with_pool`](Self::start_with_pool).
    pub fn start<T, C>(
        settings: &InstanceNodeConfig,
        transport: T,
        channel: C,
    ) -> Result<Self, NodeError>
    where
        T: Transport + PoolOwner + Send + 'static,
        T::Error: Send + Sync + 'static,
        C: InstanceChannel,
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
        let transport_err =
            |verb| move |e: T::Error| NodeError::transport(verb, T::fault_kind(&e), e);
        // SAFETY: the memory stays mapped while the transport lives (as
        // above), and the transport is dropped with the registration; the
        // node expects peers to write into its receive slots, and hands
        // out views only of slots no peer writes (`PoolMemory`'s callers).
        #[allow(unsafe_code)]
        let region = unsafe { transport.register(memory.base(), memory.len()) }
            .map_err(transport_err("register"))?;
        let (tx, rx) = channel.split();
        let session = transport.session_id().to_owned();
        let endpoint = rx.local_endpoint().to_owned();
        let caps = transport.capabilities();
        // The quarantine covers the data plane's write lifetime: a write
        // of a request that failed may land that late, and must not land
        // in the slot's next tenant.
        let config = &settings.config.quarantine_for(caps.write_lifetime);
        let quarantine = config.quarantine;
        settings.limits.check()?;
        let pool = config.pool(memory.len() as u64);
        let storage = InstanceStorage::owned(&settings.limits, &pool, config.prealloc.count)
            .map_err(NodeError::Pool)?;
        let clock = Clock::start();
        let who = InstanceIdentity {
            role: &settings.role,
            session_id: &session,
            work_endpoint: &endpoint,
            coordinator: &settings.coordinator,
            pool_ptr: memory.base() as u64,
            pool_size: pool.pool_size,
            delivery_complete: caps.delivery_complete,
            write_lifetime: caps.write_lifetime,
        };
        let machine = Instance::new(clock.now(), &who, config, storage)?;
        let n = settings.limits.requests.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                machine,
                out: vec![0; 64 * 1024],
                outbox: Outbox::with_capacity(4 * n, OUTBOX_BYTES),
                received: VecDeque::with_capacity(n),
                outcomes: VecDeque::with_capacity(4 * n),
                meta_free: (0..n)
                    .map(|_| Vec::with_capacity(settings.limits.nested_per_request))
                    .collect(),
                frames: VecDeque::new(),
            }),
            sender: Mutex::new(Sender {
                tx: Box::new(tx),
                to: settings.coordinator.clone(),
                buf: Vec::with_capacity(OUTBOX_BYTES),
            }),
            changed: Condvar::new(),
            events: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            probe: Arc::new(InstanceProbe::new(&settings.role)),
            clock,
            memory,
        });
        let wake = transport.wake_fd();
        let progress = Progress {
            shared: Arc::clone(&shared),
            transport,
            region,
            rx,
            buf: vec![0; RECV_BUF],
            writes: Vec::with_capacity(n),
            in_flight: 0,
            done: Vec::with_capacity(n),
            arrived: Vec::with_capacity(n),
            wake,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ferry-{}", settings.role))
            .spawn(move || {
                let mut progress = progress;
                // A panic must not drop the transport, and so unmap the
                // pool, while the application may hold views of it: the
                // loop's unwinding stops here and the transport goes back
                // to the node's drop. Nothing after the catch may unwind
                // with it on this thread: it is boxed first, the panic's
                // payload is forgotten (its drop could panic too), and the
                // log line is caught.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| progress.run()));
                let shared = Arc::clone(&progress.shared);
                let kept: Box<dyn Send> = Box::new(progress);
                if let Err(payload) = ran {
                    std::mem::forget(payload);
                    // The machine may have stopped half-way through a
                    // message: no new view of the pool is made from it.
                    shared.dead.store(true, Ordering::Release);
                    shared.wake();
                    let _ = std::panic::catch_unwind(|| {
                        tracing::error!(
                            "the progress thread panicked; this node makes no more progress"
                        );
                    });
                }
                kept
            })
            .map_err(NodeError::Thread)?;
        shared.drive_and_send(shared.lock(), shared.clock.now());
        Ok(Self {
            shared,
            thread: Some(thread),
            session,
            endpoint,
            quarantine,
        })
    }

    /// How long a slot of a failed request stays out of use before it is
    /// free again: the configured quarantine, raised where it is shorter
    /// to cover the data plane's write lifetime (a write of the failed
    /// request may land that late).
    pub fn quarantine(&self) -> Duration {
        self.quarantine
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
    /// its end ([`Instance::drain`](tensorferry_core::handshake::instance::Instance::drain)):
    /// [`stage`](Self::stage) is refused with
    /// [`InstanceError::Draining`](tensorferry_core::handshake::instance::InstanceError::Draining),
    /// new allocations are refused, and ferry's coordinator stops sending
    /// work here. Keep receiving and releasing until
    /// [`is_drained`](Self::is_drained) (or a grace period ends), then
    /// [`leave`](Self::leave).
    pub fn drain(&self) {
        let mut st = self.shared.lock();
        let now = self.shared.clock.now();
        st.machine.drain(now);
        self.shared.drive_and_send(st, now);
    }

    /// Requests still in progress here, on either side (slots sitting out
    /// a quarantine not counted).
    pub fn in_flight(&self) -> usize {
        self.shared.lock().machine.in_flight()
    }

    /// True once a drain is over: nothing in progress here, and ferry's
    /// coordinator said nothing more is addressed to this instance
    /// ([`Instance::is_drained`](tensorferry_core::handshake::instance::Instance::is_drained)).
    pub fn is_drained(&self) -> bool {
        self.shared.lock().machine.is_drained()
    }

    /// Ends this instance's part in everything, for `reason`
    /// ([`Instance::leave`](tensorferry_core::handshake::instance::Instance::leave)):
    /// what is still held fails; writes still posted are let finish (each
    /// reported as usual), and then the coordinator and the peers are told
    /// the instance is gone. Waits up to `timeout` for that (the data
    /// plane ends every write within its write timeout); true if it came.
    /// The message is handed to the control channel before this returns,
    /// and dropping the node closes the channel, which waits for it to go
    /// out. Transfers the application still holds are marked aborted;
    /// release them as usual.
    pub fn leave(&self, reason: &str, timeout: Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        let mut st = self.shared.lock();
        let now = self.shared.clock.now();
        st.machine.leave(now, reason);
        self.shared.drive_and_send(st, now);
        let mut st = self.shared.lock();
        while !st.machine.has_left() {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            // Completions come on the progress thread, which drives (and
            // so queues the farewell) under this lock; a completion of an
            // aborted write wakes no one, hence the short waits.
            st = self
                .shared
                .changed
                .wait_timeout(st, left.min(Duration::from_millis(10)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(st);
        // The farewell is queued; another thread may be sending it (or
        // what came before it). Waiting for the sender sees it handed over.
        self.shared.with_sender(|_| ());
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
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(NodeError::Stopped);
        }
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
        // One deadline for the whole call: a wake for a transfer that is
        // gone by the time this thread looks (its token stale) goes back
        // to waiting for what is left of it, not for `timeout` anew.
        let deadline = std::time::Instant::now().checked_add(timeout);
        let seen = self.shared.events.load(Ordering::Acquire);
        let mut st = self.shared.lock();
        if st.received.is_empty() {
            drop(st);
            self.shared.spin(seen, timeout);
            st = self.shared.lock();
        }
        loop {
            let left = deadline.map_or(timeout, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let (guard, _) = self
                .shared
                .changed
                .wait_timeout_while(st, left, |s| {
                    s.received.is_empty()
                        && !self.shared.stop.load(Ordering::Relaxed)
                        && !self.shared.dead.load(Ordering::Acquire)
                })
                .unwrap_or_else(PoisonError::into_inner);
            st = guard;
            if self.shared.dead.load(Ordering::Acquire) {
                // No new view from a machine that stopped mid-message.
                return None;
            }
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
        self.shared.next(timeout, |s| &mut s.outcomes)
    }

    /// The next message that was not a transfer message (a work item of
    /// the application), waiting at most `timeout`. The newest 1,024 are
    /// kept.
    pub fn next_frame(&self, timeout: Duration) -> Option<Frame> {
        self.shared.next(timeout, |s| &mut s.frames)
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
        self.shared.drive_and_send(st, self.shared.clock.now());
    }
}

impl InstanceNode {
    /// Sends the application's own message, `frames` as one multipart, to
    /// the coordinator on the protocol's socket: sglang's decoder returns
    /// its output to the head this way (a JSON descriptor frame, then the
    /// tensors' bytes).
    ///
    /// It goes after the protocol's messages already queued, and without
    /// the state's lock, like them.
    pub fn send_frames(&self, frames: &[&[u8]]) -> Result<(), NodeError> {
        let m = &self.shared.probe.metrics;
        self.shared
            .with_sender(|s| match s.tx.send_parts(&s.to, frames) {
                Ok(()) => {
                    Metrics::add(&m.messages_out, 1);
                    Ok(())
                }
                Err(e) => {
                    Metrics::add(&m.send_errors, 1);
                    Err(NodeError::Send {
                        to: s.to.clone(),
                        kind: e.kind,
                        source: e.source,
                    })
                }
            })
    }
}

impl Drop for InstanceNode {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            // Dropped here, after every view of the pool (each borrows the
            // node) has ended.
            let kept = t.join();
            drop(kept);
        }
        // What a turn queued and no thread sent (the progress thread's
        // last, had it panicked between the two) goes before the channel
        // closes.
        self.shared.send_queued();
    }
}
