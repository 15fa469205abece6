//! A coordinator node: ferry-core's `Coordinator` driven over a control
//! channel by one thread.
//!
//! Peers are named by their endpoint: the channel says who sent each
//! message, and the coordinator answers at that endpoint. A peer whose
//! connection closes, or to which a send finds it gone, is dropped at once:
//! its transfers fail and everyone involved is told, rather than waiting
//! for a timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStats, CoordinatorStorage, Policy,
    Timeouts,
};
use ferry_core::handshake::{Instant, Limits, PeerId};
use ferry_core::transport::{
    ChannelEvent, ControlChannel, ControlRecv, ControlSend, Fault, FaultKind,
};
use ferry_core::wire::{Msg, TRANSFER_MAGIC};
use tracing::{debug, info, warn};

use super::clock::Clock;
use super::error::NodeError;
use super::metrics::{Metrics, MetricsSnapshot};
use super::telemetry::CoordinatorProbe;

/// Preallocated slots a coordinator keeps per instance.
pub const PREALLOC_PER_INSTANCE: usize = 16;

const MAX_WAIT: Duration = Duration::from_millis(20);
const RECV_BUF: usize = 1 << 20;

/// A coordinator's settings.
#[derive(Clone, Debug)]
pub struct CoordinatorSettings {
    /// Roles in hand-off order.
    pub pipeline: Vec<String>,
    /// Receiver choice.
    pub policy: Policy,
    /// Transfers an instance may receive at once.
    pub capacity_per_instance: u32,
    /// Per-phase timeouts.
    pub timeouts: Timeouts,
    /// Wait before re-dispatching after a retryable reject (times the
    /// attempt number).
    pub retry_backoff: Duration,
    /// Dispatch attempts before a request fails.
    pub max_attempts: u32,
    /// How long a preallocated slot of a request that failed mid-write
    /// stays out of use.
    pub quarantine: Duration,
    /// How long a preallocated slot whose receiver held a failed request
    /// waits for its late `transfer_done`.
    pub late_done_wait: Duration,
    /// Table sizes.
    pub limits: Limits,
    /// The endpoint each role reports to, in pipeline order, for control
    /// channels that cannot name a message's sender (ZeroMQ): the endpoint
    /// a message arrives at tells its sender's role, and its content the
    /// sender. Empty when the channel names senders.
    pub result_endpoints: Vec<String>,
    /// The endpoints that may register, as (role, work endpoint) pairs,
    /// like sglang's `--encoder-urls`, `--denoiser-urls` and
    /// `--decoder-urls`: with any, every other registration is dropped
    /// (and logged); empty, any endpoint may register.
    pub admitted: Vec<(String, String)>,
}

impl CoordinatorSettings {
    /// ferry's defaults for `pipeline`.
    pub fn new(pipeline: &[&str]) -> Self {
        Self {
            pipeline: pipeline.iter().map(|s| (*s).to_owned()).collect(),
            policy: Policy::MostFreeSlots,
            capacity_per_instance: 16,
            timeouts: Timeouts {
                queued: Duration::from_secs(30),
                alloc: Duration::from_secs(2),
                push: Duration::from_secs(10),
                done: Duration::from_secs(60),
            },
            // A full receiver is retried for about 25 s (20 ms × 1..50),
            // within the queue timeout.
            retry_backoff: Duration::from_millis(20),
            max_attempts: 50,
            quarantine: Duration::from_secs(1),
            late_done_wait: Duration::from_secs(5),
            limits: Limits::default(),
            result_endpoints: Vec::new(),
            admitted: Vec::new(),
        }
    }
}

/// A coordinator's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorSnapshot {
    /// The state machine's counters.
    pub stats: CoordinatorStats,
    /// Instances registered.
    pub members: usize,
    /// Requests in flight.
    pub in_flight: usize,
    /// Preallocated slots taken.
    pub prealloc_taken: usize,
    /// The runtime's counters.
    pub metrics: MetricsSnapshot,
}

struct Shared {
    stop: AtomicBool,
    probe: Arc<CoordinatorProbe>,
    /// How far the application asked the coordinator to end: [`RUNNING`],
    /// [`DRAIN`] or [`SHUTDOWN`] (the progress thread acts on it).
    ending: AtomicU8,
    /// The progress thread failed what was in flight and sent the aborts.
    shut_down: AtomicBool,
}

/// The coordinator takes new work.
const RUNNING: u8 = 0;
/// It takes no new work ([`Coordinator::drain`]).
const DRAIN: u8 = 1;
/// It fails what is in flight ([`Coordinator::shutdown`]).
const SHUTDOWN: u8 = 2;

/// A running coordinator.
pub struct CoordinatorNode {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
}

impl std::fmt::Debug for CoordinatorNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorNode")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl CoordinatorNode {
    /// Starts a coordinator on `channel`; `on_event` sees every event
    /// (registrations, deliveries, failures) on the progress thread.
    pub fn start<C>(
        settings: &CoordinatorSettings,
        channel: C,
        on_event: impl FnMut(&CoordinatorEvent) + Send + 'static,
    ) -> Result<Self, NodeError>
    where
        C: ControlChannel,
        C::Sender: 'static,
        C::Receiver: 'static,
    {
        let pipeline: Vec<&str> = settings.pipeline.iter().map(String::as_str).collect();
        let config = CoordinatorConfig {
            pipeline: &pipeline,
            policy: settings.policy,
            capacity_per_instance: settings.capacity_per_instance,
            timeouts: settings.timeouts,
            retry_backoff: settings.retry_backoff,
            max_attempts: settings.max_attempts,
            quarantine: settings.quarantine,
            late_done_wait: settings.late_done_wait,
        };
        let mut limits = settings.limits;
        // Room for the whole admission list.
        limits.members = limits.members.max(settings.admitted.len());
        limits.check()?;
        let mut machine = Coordinator::new(config, CoordinatorStorage::owned(&limits))
            .map_err(NodeError::Coordinator)?;
        for (role, endpoint) in &settings.admitted {
            machine
                .admit(role, endpoint)
                .map_err(|e| NodeError::Admission {
                    role: role.clone(),
                    endpoint: endpoint.clone(),
                    source: e,
                })?;
        }
        let (tx, rx) = channel.split();
        let endpoint = rx.local_endpoint().to_owned();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            probe: Arc::new(CoordinatorProbe::new(&settings.pipeline)),
            ending: AtomicU8::new(RUNNING),
            shut_down: AtomicBool::new(false),
        });
        let mut progress = Progress {
            shared: Arc::clone(&shared),
            machine,
            tx,
            rx,
            clock: Clock::start(),
            peers: Vec::new(),
            ids: HashMap::new(),
            buf: vec![0; RECV_BUF],
            out: vec![0; 64 * 1024],
            lost: Vec::new(),
            on_event: Box::new(on_event),
            result_endpoints: settings.result_endpoints.clone(),
            peer_cap: peer_table_len(&limits),
            refusals: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("ferry-coordinator".into())
            .spawn(move || progress.run())
            .map_err(NodeError::Thread)?;
        Ok(Self {
            shared,
            thread: Some(thread),
            endpoint,
        })
    }

    /// The endpoint instances report to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Figures as of the progress thread's last turn.
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        self.shared.probe.snapshot()
    }

    /// What this coordinator measures (counters, per-leg latencies and
    /// failures by reason), readable from any thread while it runs and
    /// served to Prometheus by adding it to a
    /// [`Telemetry`](super::telemetry::Telemetry).
    pub fn probe(&self) -> &Arc<CoordinatorProbe> {
        &self.shared.probe
    }

    /// Takes no new work from now on (a new request is aborted, a
    /// registration refused, each with the reason "coordinator shutting
    /// down"); the requests in flight go on, through their next legs too.
    /// Watch
    /// [`in_flight`](Self::in_flight) fall, then [`shutdown`](Self::shutdown).
    pub fn drain(&self) {
        self.shared.ending.fetch_max(DRAIN, Ordering::AcqRel);
    }

    /// Transfers in flight, as of the progress thread's last turn.
    pub fn in_flight(&self) -> usize {
        self.snapshot().in_flight
    }

    /// Fails every transfer still in flight, each instance involved told
    /// (`transfer_abort`, "coordinator shutting down"), and waits up to
    /// `timeout` for the aborts to be handed to the control channel; true
    /// if they were. Drop the node afterwards: closing the channel waits
    /// (ZeroMQ's linger) for them to go out.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        self.shared.ending.store(SHUTDOWN, Ordering::Release);
        let end = std::time::Instant::now() + timeout;
        while !self.shared.shut_down.load(Ordering::Acquire) {
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

impl Drop for CoordinatorNode {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type OnEvent = Box<dyn FnMut(&CoordinatorEvent) + Send>;

/// The endpoints a coordinator names at once: members, and strangers
/// whose messages it answered or refused. Past this, a stranger's id is
/// reused, so that a flood of registrations under made-up endpoints costs
/// a bounded table.
fn peer_table_len(limits: &Limits) -> usize {
    4 * limits.members + 64
}

/// The peer id of `endpoint`, made on first sight; when the table is full,
/// the id of a peer that is not a member is given to it.
fn intern(
    peers: &mut Vec<String>,
    ids: &mut HashMap<String, PeerId>,
    cap: usize,
    is_member: impl Fn(PeerId) -> bool,
    endpoint: &str,
) -> PeerId {
    if let Some(&p) = ids.get(endpoint) {
        return p;
    }
    if peers.len() >= cap {
        let stranger = (1..=peers.len() as u32)
            .map(PeerId)
            .find(|&p| !is_member(p));
        if let Some(p) = stranger {
            let old = std::mem::replace(&mut peers[p.0 as usize - 1], endpoint.to_owned());
            ids.remove(&old);
            ids.insert(endpoint.to_owned(), p);
            return p;
        }
    }
    peers.push(endpoint.to_owned());
    let p = PeerId(peers.len() as u32);
    ids.insert(endpoint.to_owned(), p);
    p
}

struct Progress<S, R> {
    shared: Arc<Shared>,
    machine: Coordinator<'static, PREALLOC_PER_INSTANCE>,
    tx: S,
    rx: R,
    clock: Clock,
    /// Endpoint of peer `n` at `n - 1`.
    peers: Vec<String>,
    ids: HashMap<String, PeerId>,
    buf: Vec<u8>,
    out: Vec<u8>,
    lost: Vec<PeerId>,
    on_event: OnEvent,
    result_endpoints: Vec<String>,
    /// Most peers named at once ([`peer_table_len`]).
    peer_cap: usize,
    /// Refused registrations per peer, for logging the first and then
    /// every 100th.
    refusals: HashMap<PeerId, u64>,
}

impl<S: ControlSend, R: ControlRecv> Progress<S, R> {
    fn run(&mut self) {
        while !self.shared.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            let shut = self.follow_ending(now);
            self.drive(now);
            if shut {
                // The aborts `shutdown` queued went out in that drive.
                self.shared.shut_down.store(true, Ordering::Release);
            }
            let next = self.machine.poll_timeout();
            let wait = self.clock.until(next, MAX_WAIT);
            self.receive(wait);
        }
    }

    /// Does what the application asked of the coordinator's end; true if
    /// it shut the machine down this turn (the value is read once, so the
    /// turn that shuts down is the one that says so).
    fn follow_ending(&mut self, now: Instant) -> bool {
        match self.shared.ending.load(Ordering::Acquire) {
            DRAIN if !self.machine.is_draining() => {
                info!("draining: no new transfer or registration is taken");
                self.machine.drain();
                false
            }
            SHUTDOWN if !self.shared.shut_down.load(Ordering::Acquire) => {
                let left = self.machine.in_flight();
                if left > 0 {
                    info!(in_flight = left, "shutting down: failing what is in flight");
                }
                self.machine.shutdown(now);
                true
            }
            _ => false,
        }
    }

    fn receive(&mut self, wait: Duration) {
        let Self {
            shared,
            machine,
            rx,
            clock,
            peers,
            ids,
            buf,
            result_endpoints,
            peer_cap,
            ..
        } = self;
        let m = &shared.probe.metrics;
        let msg = match rx.recv(buf, wait) {
            Ok(Some(ChannelEvent::Message(msg))) => msg,
            Ok(Some(ChannelEvent::Gone { from })) => {
                if let Some(&peer) = ids.get(from) {
                    info!(peer = %from, "instance gone; failing its transfers");
                    Metrics::add(&m.peers_lost, 1);
                    let now = clock.now();
                    machine.peer_lost(now, peer);
                }
                return;
            }
            Ok(None) => return,
            Err(e) => {
                Metrics::add(&m.bad_frames, 1);
                warn!(error = %e, "control receive");
                return;
            }
        };
        let decoded = if msg.magic == TRANSFER_MAGIC {
            match m.decode_transfer(msg.from, msg.via, msg.payload) {
                Some(d) => d,
                None => return,
            }
        } else {
            Metrics::add(&m.non_transfer, 1);
            // sglang's decoder ends a request with its output (a tensor
            // multipart), not with `transfer_done`: it counts as one.
            match ferry_core::wire::result_as_done(msg.magic) {
                Some(done) => Msg::Done(done),
                None => {
                    debug!(via = %msg.via, "a message that is neither a transfer message nor a result");
                    return;
                }
            }
        };
        let mut name = [0u8; 256];
        let peer = match (&decoded, msg.from.is_empty()) {
            (_, false) => intern(
                peers,
                ids,
                *peer_cap,
                |p| machine.role_of(p).is_some(),
                msg.from,
            ),
            // A channel that cannot name senders: registration names the
            // endpoint to answer at, and the rest is judged by content and
            // the endpoint it arrived at.
            (Msg::Register(r), true) => match r.work_endpoint.unescape_into(&mut name) {
                Ok(e) => intern(peers, ids, *peer_cap, |p| machine.role_of(p).is_some(), e),
                Err(_) => return,
            },
            (_, true) => {
                let role = result_endpoints.iter().position(|e| e == msg.via);
                let Some(peer) = machine.sender_of(&decoded, role) else {
                    Metrics::add(&m.ignored, 1);
                    debug!(via = %msg.via, msg = ?decoded.msg_type(), "message from no known sender");
                    return;
                };
                peer
            }
        };
        let key = peers
            .get((peer.0 as usize).wrapping_sub(1))
            .map_or("", String::as_str);
        let now = clock.now();
        if let Err(why) = machine.handle(now, peer, &decoded) {
            Metrics::add(&m.ignored, 1);
            debug!(peer = %key, msg = ?decoded.msg_type(), ?why, "message ignored");
        }
    }

    fn drive(&mut self, now: Instant) {
        let Self {
            machine,
            tx,
            peers,
            out,
            lost,
            shared,
            on_event,
            refusals,
            ..
        } = self;
        if machine.poll_timeout().is_some_and(|t| t <= now) {
            machine.handle_timeout(now);
        }
        loop {
            while let Some(r) = machine.poll_transmit(out) {
                let t = match r {
                    Ok(t) => t,
                    Err(e) => {
                        out.resize(e.needed, 0);
                        continue;
                    }
                };
                let Some(to) = peers.get((t.to.0 as usize).wrapping_sub(1)) else {
                    continue;
                };
                match tx.send(to, &[TRANSFER_MAGIC, &out[..t.len]]) {
                    Ok(()) => Metrics::add(&shared.probe.metrics.messages_out, 1),
                    Err(e) => {
                        Metrics::add(&shared.probe.metrics.send_errors, 1);
                        warn!(peer = %to, error = %e, "control send failed");
                        if e.kind() == FaultKind::PeerGone && !lost.contains(&t.to) {
                            lost.push(t.to);
                        }
                    }
                }
            }
            if lost.is_empty() {
                break;
            }
            // Dropping a peer fails its transfers, which queues aborts to
            // the others: send those too.
            for peer in lost.drain(..) {
                Metrics::add(&shared.probe.metrics.peers_lost, 1);
                machine.peer_lost(now, peer);
            }
        }
        while let Some(e) = machine.poll_event() {
            match &e {
                CoordinatorEvent::Registered { peer, role, .. } => {
                    info!(peer = ?peers.get((peer.0 as usize).wrapping_sub(1)), role, "instance registered");
                }
                CoordinatorEvent::Refused {
                    peer,
                    reason,
                    acked,
                } => {
                    let endpoint = peers.get((peer.0 as usize).wrapping_sub(1));
                    // Said once per endpoint and then every 100th time: a
                    // refused instance retries, and a forger can repeat.
                    let n = refusals.entry(*peer).or_insert(0);
                    *n += 1;
                    if *n == 1 || *n % 100 == 0 {
                        warn!(
                            endpoint = endpoint.map_or("", String::as_str),
                            reason,
                            answered = acked,
                            times = *n,
                            "registration refused"
                        );
                    }
                }
                CoordinatorEvent::Delivered { id, leg, timing } => {
                    shared.probe.delivered(*leg, timing);
                    debug!(%id, leg, ?timing, "delivered");
                }
                CoordinatorEvent::Failed { id, leg, reason } => {
                    shared.probe.failed(*leg, *reason);
                    info!(%id, leg, %reason, "transfer failed");
                }
                CoordinatorEvent::Deregistered {
                    peer,
                    role,
                    draining,
                    reason,
                } => {
                    let endpoint = peers.get((peer.0 as usize).wrapping_sub(1));
                    if *draining {
                        info!(peer = ?endpoint, role, %reason, "instance draining");
                    } else {
                        info!(peer = ?endpoint, role, %reason, "instance left");
                    }
                }
            }
            on_event(&e);
        }
        let snap = CoordinatorSnapshot {
            stats: *machine.stats(),
            members: machine.members(),
            in_flight: machine.in_flight(),
            prealloc_taken: machine.prealloc_taken(),
            metrics: MetricsSnapshot::default(),
        };
        shared.probe.set_snapshot(snap);
    }
}
