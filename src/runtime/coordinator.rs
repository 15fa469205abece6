//! A coordinator node: tensorferry-core's `Coordinator` driven over a control
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

use tensorferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStats, CoordinatorStorage,
    Unhandled,
};
use tensorferry_core::handshake::{Instant, Limits, PeerId};
use tensorferry_core::transport::{
    ChannelEvent, ControlChannel, ControlRecv, ControlSend, FaultKind,
};
use tensorferry_core::wire::TRANSFER_MAGIC;
use tracing::{debug, info, warn};

use super::clock::Clock;
use super::error::NodeError;
use super::metrics::{Metrics, MetricsSnapshot};
use super::telemetry::CoordinatorProbe;

const MAX_WAIT: Duration = Duration::from_millis(20);
const RECV_BUF: usize = 1 << 20;

/// An endpoint that may register as a role (like an entry of sglang's
/// `--encoder-urls`, `--denoiser-urls` or `--decoder-urls`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The role it may register as.
    pub role: String,
    /// Its work endpoint, as its registration names it.
    pub endpoint: String,
}

/// A coordinator node's configuration: the core's [`CoordinatorConfig`]
/// (receiver choice, capacity, timeouts), extended by what a node needs
/// besides: its pipeline, its tables, who may register, and how to tell
/// senders apart on channels that cannot name them.
#[derive(Clone, Debug)]
pub struct CoordinatorNodeConfig {
    /// Roles in hand-off order.
    pub pipeline: Vec<String>,
    /// Table sizes.
    pub limits: Limits,
    /// How the coordinator behaves ([`CoordinatorConfig::FERRY`] by
    /// default).
    pub config: CoordinatorConfig,
    /// The endpoint each role reports to, in pipeline order, for control
    /// channels that cannot name a message's sender (ZeroMQ): the endpoint
    /// a message arrives at tells its sender's role, and its content the
    /// sender. Empty when the channel names senders. Each at most
    /// [`NAME_LEN`](tensorferry_core::handshake::NAME_LEN) (128) bytes, as every
    /// endpoint the coordinator keeps.
    pub result_endpoints: Vec<String>,
    /// The endpoints that may register: with any, every other
    /// registration is dropped (and logged); empty, any endpoint may
    /// register.
    pub admitted: Vec<Admission>,
}

impl CoordinatorNodeConfig {
    /// ferry's defaults for `pipeline`.
    pub fn new(pipeline: &[&str]) -> Self {
        Self {
            pipeline: pipeline.iter().map(|s| (*s).to_owned()).collect(),
            limits: Limits::default(),
            config: CoordinatorConfig::FERRY,
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

debug_naming!(CoordinatorNode, |n| { "endpoint": n.endpoint });

impl CoordinatorNode {
    /// Starts a coordinator on `channel`; `on_event` sees every event
    /// (registrations, deliveries, failures) on the progress thread.
    pub fn start<C>(
        settings: &CoordinatorNodeConfig,
        channel: C,
        on_event: impl FnMut(&CoordinatorEvent) + Send + 'static,
    ) -> Result<Self, NodeError>
    where
        C: ControlChannel,
        C::Sender: 'static,
        C::Receiver: 'static,
    {
        let pipeline: Vec<&str> = settings.pipeline.iter().map(String::as_str).collect();
        let config = settings.config;
        let mut limits = settings.limits;
        // Room for the whole admission list.
        limits.members = limits.members.max(settings.admitted.len());
        limits.check()?;
        let mut machine = Coordinator::new(&pipeline, config, CoordinatorStorage::owned(&limits))
            .map_err(NodeError::Coordinator)?;
        for Admission { role, endpoint } in &settings.admitted {
            machine
                .admit(role, endpoint)
                .map_err(|e| NodeError::Admission {
                    role: role.clone(),
                    endpoint: endpoint.clone(),
                    source: e,
                })?;
        }
        for (role, endpoint) in settings.pipeline.iter().zip(&settings.result_endpoints) {
            machine
                .set_role_endpoint(role, endpoint)
                .map_err(NodeError::Coordinator)?;
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
            buf: vec![0; RECV_BUF],
            out: vec![0; 64 * 1024],
            lost: Vec::new(),
            on_event: Box::new(on_event),
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

struct Progress<S, R> {
    shared: Arc<Shared>,
    machine: Coordinator<'static>,
    tx: S,
    rx: R,
    clock: Clock,
    buf: Vec<u8>,
    out: Vec<u8>,
    lost: Vec<PeerId>,
    on_event: OnEvent,
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
            buf,
            ..
        } = self;
        let m = &shared.probe.metrics;
        let msg = match rx.recv(buf, wait, None) {
            Ok(Some(ChannelEvent::Message(msg))) => msg,
            Ok(Some(ChannelEvent::Gone { from })) => {
                if machine.handle_gone(clock.now(), from) {
                    info!(peer = %from, "instance gone; its transfers failed");
                    Metrics::add(&m.peers_lost, 1);
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
        if msg.magic == TRANSFER_MAGIC {
            Metrics::add(&m.messages_in, 1);
        } else {
            Metrics::add(&m.non_transfer, 1);
        }
        match machine.handle_incoming(clock.now(), &msg) {
            Ok(_) => {}
            Err(Unhandled::Malformed(e)) => m.malformed(msg.from, msg.via, &e),
            Err(Unhandled::Foreign) => {
                debug!(via = %msg.via, "a message that is neither a transfer message nor a result");
            }
            Err(why @ (Unhandled::UnknownSender | Unhandled::Ignored { .. })) => {
                Metrics::add(&m.ignored, 1);
                debug!(from = %msg.from, via = %msg.via, %why, "message ignored");
            }
        }
    }

    fn drive(&mut self, now: Instant) {
        let Self {
            machine,
            tx,
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
                let Some(to) = machine.endpoint_of(t.to) else {
                    continue;
                };
                match tx.send(to, &[TRANSFER_MAGIC, &out[..t.len]]) {
                    Ok(()) => Metrics::add(&shared.probe.metrics.messages_out, 1),
                    Err(e) => {
                        Metrics::add(&shared.probe.metrics.send_errors, 1);
                        warn!(peer = %to, error = %e, "control send failed");
                        if S::fault_kind(&e) == FaultKind::PeerGone && !lost.contains(&t.to) {
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
                // Counted as a connection's end is: registered instances
                // only (a refused stranger's departure is nobody's loss).
                if machine.role_of(peer).is_some() {
                    Metrics::add(&shared.probe.metrics.peers_lost, 1);
                }
                machine.peer_lost(now, peer);
            }
        }
        while let Some(e) = machine.poll_event() {
            match &e {
                CoordinatorEvent::Registered { peer, role, .. } => {
                    info!(peer = ?machine.endpoint_of(*peer), role, "instance registered");
                }
                CoordinatorEvent::Refused {
                    peer,
                    reason,
                    acked,
                } => {
                    let endpoint = machine.endpoint_of(*peer);
                    // Said once per endpoint and then every 100th time: a
                    // refused instance retries, and a forger can repeat.
                    let n = refusals.entry(*peer).or_insert(0);
                    *n += 1;
                    if *n == 1 || *n % 100 == 0 {
                        warn!(
                            endpoint = endpoint.unwrap_or(""),
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
                    let endpoint = machine.endpoint_of(*peer);
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
