//! The coordinator process: its channel, its metrics, and its run until a
//! stop, drained.

use super::*;
use tensorferry_zmq::zmq;

/// A coordinator process: its node's configuration (the pipeline, the
/// timeouts, who is admitted) extended with where it binds and how the
/// process lives.
#[derive(Clone, Debug)]
pub struct CoordinatorProcessConfig {
    /// The node's own configuration (its `result_endpoints` are set from
    /// the endpoints ZeroMQ binds).
    pub node: CoordinatorNodeConfig,
    /// The endpoints it binds: with ZeroMQ one per role of the pipeline
    /// (in order); over Unix sockets, the first only.
    pub endpoints: Vec<String>,
    /// The control channel.
    pub control: Control,
    /// Stop when stdin closes, as well as on SIGTERM or SIGINT.
    pub exit_on_stdin_close: bool,
    /// How long a stop waits for the transfers in flight to end before it
    /// fails them.
    pub drain_timeout: Duration,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_listen: Option<String>,
    /// Who may connect to its ZeroMQ endpoints (addresses, CURVE keys).
    pub guard: tensorferry_zmq::Guard,
}

impl CoordinatorProcessConfig {
    /// ferry's pipeline at `endpoints` over `control`, with a push timeout
    /// of `push`, and the defaults of the rest.
    pub fn new(endpoints: Vec<String>, control: Control, push: Duration) -> Self {
        let mut node = CoordinatorNodeConfig::new(&PIPELINE);
        node.config.timeouts.push = push;
        Self {
            node,
            endpoints,
            control,
            exit_on_stdin_close: false,
            drain_timeout: DRAIN_TIMEOUT,
            metrics_listen: None,
            guard: tensorferry_zmq::Guard::default(),
        }
    }
}

/// The grace period of a stop, unless `--drain-timeout` says otherwise.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the coordinator until it is stopped (SIGTERM, SIGINT, or stdin's
/// end if asked).
pub fn coordinator(process: &CoordinatorProcessConfig) -> ExitCode {
    let life = match lifetime(process.exit_on_stdin_close) {
        Ok(l) => l,
        Err(code) => return code,
    };
    remove_stale_pools();
    let mut settings = process.node.clone();
    let run = Run {
        life: &life,
        metrics: process.metrics_listen.as_deref(),
        drain_timeout: process.drain_timeout,
    };
    let Some(first) = process.endpoints.first() else {
        return fail("bind", "no endpoint to bind");
    };
    match process.control {
        Control::Uds => match UdsChannel::bind(first) {
            Ok(c) => run_coordinator(&settings, c, &run),
            Err(e) => fail("bind", e),
        },
        Control::Zmq => {
            let ctx = zmq::Context::new();
            let eps: Vec<&str> = process.endpoints.iter().map(String::as_str).collect();
            match ZmqChannel::bind_guarded(&ctx, &eps, ZmqConfig::default(), &process.guard) {
                Ok(c) => {
                    settings.result_endpoints = c.endpoints();
                    run_coordinator(&settings, c, &run)
                }
                Err(e) => fail("bind", e),
            }
        }
    }
}

/// How a process runs: its lifetime, where it serves metrics and probes,
/// and how long a stop drains.
pub(super) struct Run<'l> {
    life: &'l Lifetime,
    metrics: Option<&'l str>,
    drain_timeout: Duration,
}

/// Serves the nodes `add` puts in a [`Telemetry`] at `listen`, if given,
/// with `/readyz` answering as `ready` says, and says where on stdout; the
/// endpoint lives as long as the value.
pub(super) fn serve_metrics(
    listen: Option<&str>,
    ready: &Readiness,
    add: impl FnOnce(&Telemetry),
) -> Result<Option<MetricsServer>, ExitCode> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let telemetry = Telemetry::new();
    add(&telemetry);
    match MetricsServer::with_readiness(listen, telemetry, ready.clone()) {
        Ok(server) => {
            emit_json(&json!({"event": "metrics", "url": server.url()}));
            Ok(Some(server))
        }
        Err(e) => Err(fail("metrics", e)),
    }
}

pub(super) fn run_coordinator<C>(
    settings: &CoordinatorNodeConfig,
    channel: C,
    run: &Run<'_>,
) -> ExitCode
where
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: 'static,
{
    let node = CoordinatorNode::start(settings, channel, |e| match e {
        CoordinatorEvent::Registered { role, .. } => {
            emit_json(&json!({"event": "registered", "role": role}));
        }
        CoordinatorEvent::Refused { reason, acked, .. } => {
            emit_json(&json!({"event": "refused", "reason": reason, "answered": acked}));
        }
        // With how long the leg waited for a slot and how long its bytes
        // moved, on this coordinator's clock: the pipeline's summary
        // tells the two apart.
        CoordinatorEvent::Delivered { id, leg, timing } => emit_json(&json!({
            "event": "delivered",
            "id": id.as_str(),
            "leg": leg,
            "queued_us": timing.queued.as_micros() as u64,
            "written_us": timing.written.as_micros() as u64,
        })),
        CoordinatorEvent::Failed { id, leg, reason } => emit_json(&json!({
            "event": "failed",
            "id": id.as_str(),
            "leg": leg,
            "reason": reason.as_str(),
        })),
        CoordinatorEvent::Deregistered {
            role,
            draining,
            reason,
            ..
        } => emit_json(&json!({
            "event": if *draining { "instance_draining" } else { "instance_left" },
            "role": role,
            "reason": reason.as_str(),
        })),
    });
    let node = match node {
        Ok(n) => n,
        Err(e) => return fail("start coordinator", e),
    };
    let ready = Readiness::new();
    let _metrics = match serve_metrics(run.metrics, &ready, |t| {
        t.add_coordinator(node.probe(), "coordinator")
    }) {
        Ok(m) => m,
        Err(code) => return code,
    };
    ready.set(true);
    emit_json(&json!({"event": "ready", "pid": std::process::id()}));
    while run.life.running() {
        run.life.sleep(Duration::from_millis(100));
    }
    let stop = stop_coordinator(&node, run.life, run.drain_timeout, &ready);
    let s = node.snapshot();
    let probe = node.probe();
    // Per leg: deliveries and the hand-off latency as the metrics endpoint
    // serves them (its histogram), exactly.
    let legs: serde_json::Map<String, serde_json::Value> = probe
        .pipeline()
        .iter()
        .zip(&probe.legs)
        .map(|(role, l)| {
            let h = l.handoff.snapshot();
            let us = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e6);
            let leg = json!({
                "delivered": l.delivered(),
                "handoff_count": h.count,
                "handoff_sum_us": h.sum.as_secs_f64() * 1e6,
                "handoff_min_us": us(h.min),
                "handoff_max_us": us(h.max),
            });
            (role.clone(), leg)
        })
        .collect();
    emit_json(&json!({
        "event": "summary",
        "role": "coordinator",
        "delivered": s.stats.delivered,
        "failed": s.stats.failed,
        "fast_path": s.stats.fast_path,
        "in_flight": s.in_flight,
        "prealloc_taken": s.prealloc_taken,
        "ignored": s.metrics.ignored,
        "legs": legs,
        "stop": stop,
    }));
    ExitCode::SUCCESS
}
