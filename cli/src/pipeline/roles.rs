//! The pipeline's processes: a coordinator, and instances of each role.
//! Each reports on stdout, one JSON object per line, and runs until SIGTERM
//! or SIGINT (or, with `--exit-on-stdin-close`, until its stdin closes);
//! then it drains (`stopping.rs`), prints its summary and exits.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_core::handshake::coordinator::{CoordinatorEvent, Timeouts};
use ferry_core::handshake::instance::InstanceError;
use ferry_core::json::RawJson;
use ferry_core::transport::ControlChannel;
use ferry_shm::UdsChannel;
use ferry_zmq::{ZmqChannel, ZmqSettings};

use super::data;
use super::sglang::{self, SglangRole, SglangTally};
use super::stopping::{await_registration, stop_coordinator, Ending};
use crate::lifetime::Lifetime;
use ferry::runtime::telemetry::Telemetry;
use ferry::runtime::Head;
use ferry::runtime::Prealloc;
use ferry::runtime::{
    CoordinatorNode, CoordinatorSettings, Delivery, InstanceNode, InstanceSettings, NodeError,
    Staging,
};
use serde_json::json;

use crate::metrics_http::{MetricsServer, Readiness};

/// The control plane the processes talk over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Control {
    /// Unix seqpacket sockets (one host).
    Uds,
    /// ZeroMQ with sglang's layout: PULL bound per process (and per role
    /// at the coordinator), PUSH to peers; ipc:// or tcp:// endpoints.
    Zmq,
}

/// The data plane an instance writes and receives over: the library's.
pub use ferry::runtime::DataPlane;

/// What an instance sends and what it checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// The pipeline's tensors: prompt embeddings and latents, forwarded by
    /// denoisers.
    #[default]
    Pipeline,
    /// One `uint8` tensor per request of a random size (seeded, from one
    /// byte to `max_bytes`);
    /// receivers check every byte and release (no forwarding).
    Random {
        /// Seeds the sizes (sender and receivers must agree).
        seed: u64,
        /// The largest size.
        max_bytes: u64,
    },
    /// sglang's roles under sglang's head (see `sglang.rs`): the encoder
    /// stages for the work items the head dispatches, denoisers check and
    /// forward, the decoder checks and returns an output tensor.
    Sglang,
}

/// The pipeline's roles, in hand-off order.
pub const PIPELINE: [&str; 3] = ["encoder", "denoiser", "decoder"];

/// Prints one JSON object as a line (serde_json writes it: ids and errors
/// from peers are escaped), flushed at once: the launcher reads it as it
/// comes.
pub(crate) fn emit_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Nanoseconds on the wall clock (all processes are on one host).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Takes over SIGTERM and SIGINT (and stdin's end, if asked), or says why
/// it cannot.
fn lifetime(exit_on_stdin_close: bool) -> Result<Lifetime, ExitCode> {
    Lifetime::start(exit_on_stdin_close).map_err(|e| fail("signals", e))
}

fn fail(what: &str, e: impl std::fmt::Display) -> ExitCode {
    emit_json(&json!({"event": "error", "what": what, "error": e.to_string()}));
    ExitCode::FAILURE
}

/// What a coordinator process is told besides its endpoints.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// Stop when stdin closes, as well as on SIGTERM or SIGINT.
    pub exit_on_stdin_close: bool,
    /// How long a stop waits for the transfers in flight to end before it
    /// fails them.
    pub drain_timeout: Duration,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics_listen: Option<String>,
    /// The endpoints that may register, each as its role; empty: any.
    pub admitted: Vec<ferry::runtime::Admission>,
    /// The addresses that may connect (ZeroMQ over tcp); empty: any.
    pub allow_from: Vec<std::net::IpAddr>,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        Self {
            exit_on_stdin_close: false,
            drain_timeout: DRAIN_TIMEOUT,
            metrics_listen: None,
            admitted: Vec::new(),
            allow_from: Vec::new(),
        }
    }
}

/// The grace period of a stop, unless `--drain-timeout` says otherwise.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the coordinator until it is stopped (SIGTERM, SIGINT, or stdin's
/// end if asked). With ZeroMQ it binds one result endpoint per role of the
/// pipeline (in order); over Unix sockets, the first endpoint only.
pub fn coordinator(
    endpoints: &[String],
    control: Control,
    timeouts: Timeouts,
    options: &CoordinatorOptions,
) -> ExitCode {
    let life = match lifetime(options.exit_on_stdin_close) {
        Ok(l) => l,
        Err(code) => return code,
    };
    remove_stale_pools();
    let mut settings = CoordinatorSettings::new(&PIPELINE);
    settings.config.timeouts = timeouts;
    settings.admitted = options.admitted.clone();
    let run = Run {
        life: &life,
        metrics: options.metrics_listen.as_deref(),
        drain_timeout: options.drain_timeout,
    };
    match control {
        Control::Uds => match UdsChannel::bind(&endpoints[0]) {
            Ok(c) => run_coordinator(&settings, c, &run),
            Err(e) => fail("bind", e),
        },
        Control::Zmq => {
            let ctx = zmq::Context::new();
            let eps: Vec<&str> = endpoints.iter().map(String::as_str).collect();
            match ZmqChannel::bind_allowing(&ctx, &eps, ZmqSettings::default(), &options.allow_from)
            {
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
struct Run<'l> {
    life: &'l Lifetime,
    metrics: Option<&'l str>,
    drain_timeout: Duration,
}

/// Serves the nodes `add` puts in a [`Telemetry`] at `listen`, if given,
/// with `/readyz` answering as `ready` says, and says where on stdout; the
/// endpoint lives as long as the value.
fn serve_metrics(
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

fn run_coordinator<C>(settings: &CoordinatorSettings, channel: C, run: &Run<'_>) -> ExitCode
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
        CoordinatorEvent::Delivered { id, leg, .. } => {
            emit_json(&json!({"event": "delivered", "id": id.as_str(), "leg": leg}));
        }
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
    let _metrics = match serve_metrics(run.metrics, &ready, |t| t.add_coordinator(node.probe())) {
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

/// One instance process's settings.
#[derive(Clone, Debug)]
pub struct InstanceArgs {
    /// `encoder`, `denoiser` or `decoder`.
    pub role: String,
    /// Its name in reports (`denoiser-1`).
    pub name: String,
    /// The coordinator's endpoint.
    pub coordinator: String,
    /// Its own endpoint.
    pub endpoint: String,
    /// Requests the encoder sends.
    pub requests: u64,
    /// Requests the encoder keeps in flight.
    pub window: usize,
    /// The control plane.
    pub control: Control,
    /// Pool size in MiB (0: the role's default).
    pub pool_mib: usize,
    /// Preallocated receive slots: how many, MiB each (None: the role's
    /// default).
    pub prealloc: Option<(usize, u64)>,
    /// The encoder's pause between requests.
    pub pace: Duration,
    /// How long a denoiser or decoder works on each request (holding it)
    /// before it forwards and releases it.
    pub hold: Duration,
    /// The data plane.
    pub data_plane: DataPlane,
    /// What to send and check.
    pub workload: Workload,
    /// How long a reserved receive slot waits for `transfer_ready`.
    pub reserved_timeout: Duration,
    /// The coordinator's kind.
    pub head: Head,
    /// sglang's head's timeout (`--disagg-timeout`), when `head` is sglang.
    pub head_timeout: Duration,
    /// Where to serve Prometheus metrics (`host:port`), if anywhere.
    pub metrics_listen: Option<String>,
    /// The addresses that may connect (ZeroMQ over tcp); empty: any.
    pub allow_from: Vec<std::net::IpAddr>,
    /// Stop when stdin closes, as well as on SIGTERM or SIGINT.
    pub exit_on_stdin_close: bool,
    /// How long a stop waits for what is in flight to end before it fails
    /// it.
    pub drain_timeout: Duration,
}

/// Counts and latencies an instance reports.
#[derive(Default)]
struct Tally {
    received: u64,
    verified: u64,
    mismatches: u64,
    forwarded: u64,
    forward_failed: u64,
    /// Requests committed (announced to the coordinator).
    staged: u64,
    sent: u64,
    send_failed: u64,
    /// Why requests were not sent, with how many each.
    failures: std::collections::BTreeMap<String, u64>,
    latencies_us: Vec<u64>,
}

/// Removes the pools of processes that died without removing them (SIGKILL,
/// a crash), and says which: what a restarted process finds of its
/// predecessor.
fn remove_stale_pools() {
    let removed = ferry_shm::clean_stale();
    if !removed.is_empty() {
        emit_json(&json!({"event": "stale_pools_removed", "objects": removed}));
    }
}

/// Runs an instance until it is stopped (SIGTERM, SIGINT, or stdin's end
/// if asked).
pub fn instance(args: &InstanceArgs) -> ExitCode {
    let life = match lifetime(args.exit_on_stdin_close) {
        Ok(l) => l,
        Err(code) => return code,
    };
    remove_stale_pools();
    let mut settings = InstanceSettings::new(&args.role, &args.coordinator);
    settings.config.reserved_timeout = args.reserved_timeout;
    if args.head == Head::Sglang {
        settings = settings.under_sglang(args.head_timeout);
    }
    let slot = 16u64 << 20;
    let mut pool: usize = match args.role.as_str() {
        "encoder" => 256 << 20,
        "denoiser" => {
            settings.config.prealloc = Prealloc {
                count: 4,
                size: slot,
            };
            512 << 20
        }
        _ => {
            settings.config.prealloc = Prealloc {
                count: 4,
                size: slot,
            };
            256 << 20
        }
    };
    if let Some((n, mib)) = args.prealloc {
        settings.config.prealloc = Prealloc {
            count: n,
            size: mib << 20,
        };
    }
    if let Workload::Random { max_bytes, .. } = args.workload {
        match random_pool(&settings, max_bytes, args.pool_mib, pool) {
            Ok(p) => pool = p,
            Err(e) => return fail("pool", e),
        }
    } else if args.pool_mib > 0 {
        pool = args.pool_mib << 20;
    }
    let plane = &args.data_plane;
    if args.workload == Workload::Sglang {
        // sglang's sockets are ZeroMQ's, and the decoder's output needs
        // a channel that carries any number of frames.
        let role = match SglangRole::from_name(&args.role) {
            Ok(r) => r,
            Err(e) => return fail("start instance", e),
        };
        let channel = match bind_zmq(args) {
            Ok(c) => c,
            Err(code) => return code,
        };
        return match plane.start_instance(&settings, pool, channel) {
            Ok(node) => run_sglang(&node, args, role, &life),
            Err(e) => fail("start instance", e),
        };
    }
    match args.control {
        Control::Uds if !plane.needs_zmq() => {
            match plane.start_instance_at(&settings, pool, &args.endpoint) {
                Ok(node) => run_instance(&node, args, &life),
                Err(e) => fail("start instance", e),
            }
        }
        _ => {
            let channel = match bind_zmq(args) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match plane.start_instance(&settings, pool, channel) {
                Ok(node) => run_instance(&node, args, &life),
                Err(e) => fail("start instance", e),
            }
        }
    }
}

/// The pool the random workload needs: the preallocated slots, and room
/// for its largest request twice over (a slot is a power of two of at
/// least `min_block`), in whole `min_block`s. The pool `--pool-mib` asks
/// for is taken as given if it holds that, and refused with what it needs
/// if not; without it, the role's `default` grows to what is needed.
fn random_pool(
    settings: &InstanceSettings,
    max_bytes: u64,
    pool_mib: usize,
    default: usize,
) -> Result<usize, String> {
    let block = settings.config.min_block.max(1);
    let Prealloc {
        count: slots,
        size: slot,
    } = settings.config.prealloc;
    let prealloc = (slots as u64).saturating_mul(slot);
    let largest = max_bytes.next_power_of_two().max(block);
    let need = prealloc
        .saturating_add(largest.saturating_mul(2))
        .div_ceil(block)
        .saturating_mul(block);
    let need_mib = need.div_ceil(1 << 20);
    if pool_mib == 0 {
        return usize::try_from(need)
            .map(|need| need.max(default))
            .map_err(|_| {
                format!("a pool of {need} bytes does not fit this machine's address space")
            });
    }
    let asked = (pool_mib as u64).saturating_mul(1 << 20);
    if asked < need {
        return Err(format!(
            "--pool-mib {pool_mib} is too small: {slots} preallocated slot(s) of {} MiB take {} MiB, and two requests of up to {max_bytes} bytes (--max-bytes) need {} MiB more; give --pool-mib {need_mib} or more, or fewer or smaller --prealloc slots",
            slot >> 20,
            prealloc >> 20,
            largest.saturating_mul(2).div_ceil(1 << 20),
        ));
    }
    usize::try_from(asked)
        .map_err(|_| format!("--pool-mib {pool_mib} does not fit this machine's address space"))
}

/// The instance's ZeroMQ channel at its endpoint.
fn bind_zmq(args: &InstanceArgs) -> Result<ZmqChannel, ExitCode> {
    if args.control != Control::Zmq && args.data_plane.needs_zmq() {
        return Err(fail(
            "start instance",
            "the libfabric and verbs data planes pair with the ZeroMQ control plane (--control zmq)",
        ));
    }
    let ctx = zmq::Context::new();
    ZmqChannel::bind_allowing(
        &ctx,
        &[&args.endpoint],
        ZmqSettings::default(),
        &args.allow_from,
    )
    .map_err(|e| fail("bind", e))
}

/// Serves metrics and probes for an instance (if asked) and waits for its
/// registration; `Err` holds the exit code when that failed or a stop came
/// first.
fn start_serving(
    node: &InstanceNode,
    args: &InstanceArgs,
    life: &Lifetime,
    ready: &Readiness,
) -> Result<Option<MetricsServer>, ExitCode> {
    let metrics = serve_metrics(args.metrics_listen.as_deref(), ready, |t| {
        t.add_instance(node.probe(), &args.name);
    })?;
    match await_registration(node, life, Duration::from_secs(30)) {
        Ok(true) => {}
        Ok(false) => {
            emit_json(&json!({
                "event": "stopped",
                "name": args.name,
                "cause": life.cause().map(crate::lifetime::Cause::name),
                "registered": false,
            }));
            return Err(ExitCode::SUCCESS);
        }
        Err(e) => return Err(fail("register", e)),
    }
    ready.set(true);
    emit_json(&json!({
        "event": "registered",
        "name": args.name,
        "pid": std::process::id(),
        "session_id": node.session_id(),
    }));
    Ok(metrics)
}

/// Runs an instance of the sglang workload until it is stopped.
fn run_sglang(
    node: &InstanceNode,
    args: &InstanceArgs,
    role: SglangRole,
    life: &Lifetime,
) -> ExitCode {
    let ready = Readiness::new();
    let _metrics = match start_serving(node, args, life, &ready) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let mut ending = Ending::new(life, node, args.drain_timeout, ready);
    let mut tally = SglangTally::default();
    sglang::run(node, role, &mut ending, &mut tally);
    let stop = ending.leave();
    let s = node.stats();
    emit_json(&json!({
        "event": "summary",
        "role": args.role,
        "name": args.name,
        "work_items": tally.work_items,
        "staged": tally.staged,
        "received": tally.received,
        "verified": tally.verified,
        "mismatches": tally.mismatches,
        "outputs": tally.outputs,
        "errors": tally.errors,
        "sent": s.metrics.sent,
        "send_failed": s.metrics.send_failed,
        "bytes_written": s.metrics.bytes_written,
        "requests_held": s.requests_held,
        "live_slots": s.live_slots,
        "prealloc_slots": s.prealloc_slots,
        "allocs_held": s.instance.allocs_held,
        "forwarded": s.instance.forwarded,
        "stop": stop,
    }));
    ExitCode::SUCCESS
}

fn run_instance(node: &InstanceNode, args: &InstanceArgs, life: &Lifetime) -> ExitCode {
    let ready = Readiness::new();
    let _metrics = match start_serving(node, args, life, &ready) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let mut ending = Ending::new(life, node, args.drain_timeout, ready);
    let mut tally = Tally::default();
    let result = match (args.role.as_str(), args.workload) {
        ("encoder", _) => encode(node, args, &mut ending, &mut tally),
        // The random workload ends at its first receiver.
        ("denoiser", Workload::Pipeline) => serve(
            node,
            &mut ending,
            &mut tally,
            true,
            args.hold,
            args.workload,
        ),
        _ => serve(
            node,
            &mut ending,
            &mut tally,
            false,
            args.hold,
            args.workload,
        ),
    };
    if let Err(e) = result {
        ending.leave();
        return fail(&args.role, e);
    }
    while ending.keep_going() {
        drain_outcomes(node, &mut tally, Duration::from_millis(20));
    }
    let stop = ending.leave();
    while drain_outcomes(node, &mut tally, Duration::ZERO) {}
    let s = node.stats();
    emit_json(&json!({
        "event": "summary",
        "role": args.role,
        "name": args.name,
        "received": tally.received,
        "verified": tally.verified,
        "mismatches": tally.mismatches,
        "forwarded": tally.forwarded,
        "forward_failed": tally.forward_failed,
        "staged": tally.staged,
        "sent": tally.sent,
        "send_failed": tally.send_failed,
        "bytes_written": s.metrics.bytes_written,
        "requests_held": s.requests_held,
        "live_slots": s.live_slots,
        "prealloc_slots": s.prealloc_slots,
        "ignored": s.metrics.ignored,
        "bad_frames": s.metrics.bad_frames,
        "failures": tally.failures,
        "stop": stop,
        "latencies_us": tally.latencies_us,
    }));
    ExitCode::SUCCESS
}

fn drain_outcomes(node: &InstanceNode, tally: &mut Tally, wait: Duration) -> bool {
    match node.next_outcome(wait) {
        Some(o) if o.sent => tally.sent += 1,
        Some(o) => {
            tally.send_failed += 1;
            *tally
                .failures
                .entry(o.reason.as_str().to_owned())
                .or_default() += 1;
        }
        None => return false,
    }
    true
}

fn scalars(n: u64) -> String {
    json!({
        "n": n,
        "prompt": "a red fox running through fresh snow at dawn, cinematic",
        "negative_prompt": "",
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
        "seed": 1000 + n,
        "height": 720,
        "width": 1280,
        "num_frames": 81,
        "t_commit_ns": wall_ns(),
    })
    .to_string()
}

/// Stages a request, retrying while the pool or the request table is full
/// (the receivers drain it), for at most `patience`; `while_waiting` runs
/// between tries and says whether to go on trying.
pub(crate) fn stage_with_patience<'n, 'a>(
    node: &'n InstanceNode,
    id: &str,
    specs: &[ferry_core::slots::TensorSpec<'a>],
    patience: Duration,
    mut while_waiting: impl FnMut() -> bool,
) -> Result<Staging<'n, 'a>, NodeError> {
    let start = Instant::now();
    loop {
        match node.stage(id, specs) {
            Err(NodeError::Instance(InstanceError::Pool(_) | InstanceError::TableFull))
                if start.elapsed() < patience && while_waiting() => {}
            other => return other,
        }
    }
}

/// A denoiser's hand-off: stages the denoised latents of request `n` under
/// the delivery's id (waiting up to 30 s for room, while `patient` says so)
/// and forwards them with `scalar_fields`, which lets go of the delivery.
/// On an error the delivery is failed.
pub(crate) fn forward_denoised(
    node: &InstanceNode,
    d: Delivery<'_>,
    n: u64,
    scalar_fields: &str,
    patient: &dyn Fn() -> bool,
) -> Result<(), NodeError> {
    let id = d.id().to_owned();
    let specs = data::denoiser_tensors();
    let staged = stage_with_patience(node, &id, &specs, Duration::from_secs(30), || {
        std::thread::sleep(Duration::from_millis(1));
        patient()
    });
    let mut staged = match staged {
        Ok(s) => s,
        Err(e) => {
            d.fail("no room to stage the denoised latents");
            return Err(e);
        }
    };
    if let Some(t) = staged.tensor_mut(0) {
        data::fill_denoised(t, n);
    }
    // The next leg staged and the input let go of at once (one message
    // under sglang's head).
    staged.forward(d, scalar_fields)
}

/// The encoder: sends `requests` requests, at most `window` in flight,
/// until it is asked to stop.
fn encode(
    node: &InstanceNode,
    args: &InstanceArgs,
    ending: &mut Ending<'_>,
    tally: &mut Tally,
) -> Result<(), NodeError> {
    let pipeline_specs = data::encoder_tensors();
    let mut dims = [0u64; 1];
    for n in 0..args.requests {
        while (n - tally.sent - tally.send_failed) as usize >= args.window {
            if !ending.taking_work() {
                return Ok(());
            }
            drain_outcomes(node, tally, Duration::from_millis(50));
        }
        if !args.pace.is_zero() {
            ending.sleep(args.pace);
        }
        if !ending.taking_work() {
            return Ok(());
        }
        let id = format!("{}-{n}", args.name);
        let random_spec;
        let specs: &[ferry_core::slots::TensorSpec<'_>] = match args.workload {
            // (The sglang workload's encoder runs in `sglang.rs`.)
            Workload::Pipeline | Workload::Sglang => &pipeline_specs,
            Workload::Random { seed, max_bytes } => {
                dims[0] = data::random_size(seed, n, max_bytes);
                random_spec = [data::blob(&dims)];
                &random_spec
            }
        };
        let staging = stage_with_patience(node, &id, specs, Duration::from_secs(60), || {
            drain_outcomes(node, tally, Duration::from_millis(5));
            ending.taking_work()
        });
        let mut staging = match staging {
            Ok(s) => s,
            // Asked to stop while it waited for room.
            Err(NodeError::Instance(InstanceError::Pool(_) | InstanceError::TableFull))
                if !ending.taking_work() =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for k in 0..specs.len() {
            if let Some(t) = staging.tensor_mut(k) {
                data::fill(t, n, k as u64);
            }
        }
        staging.commit(&scalars(n))?;
        tally.staged += 1;
    }
    // Every request ends, sent or failed.
    while tally.sent + tally.send_failed < args.requests && ending.keep_going() {
        drain_outcomes(node, tally, Duration::from_millis(50));
    }
    emit_json(&json!({
        "event": "encoded",
        "sent": tally.sent,
        "send_failed": tally.send_failed,
        "failures": tally.failures,
    }));
    Ok(())
}

fn scalar_u64(scalars: &str, key: &str) -> Option<u64> {
    RawJson::parse_object(scalars)
        .ok()?
        .get(key)?
        .as_str()
        .parse()
        .ok()
}

/// Checks a delivery of request `n` against what its sender made: the
/// field and first byte that differ, if any.
fn verify(d: &Delivery<'_>, n: u64, workload: Workload, forward: bool) -> Option<(String, usize)> {
    let mut bad = None;
    let mut seen = 0;
    for v in d.tensors() {
        seen += 1;
        let at = match (workload, v.field.raw(), forward) {
            (Workload::Random { seed, max_bytes }, _, _) => {
                let want = data::random_size(seed, n, max_bytes);
                if v.bytes.len() as u64 != want {
                    Some(v.bytes.len().min(want as usize))
                } else {
                    data::check(v.bytes, n, 0)
                }
            }
            (_, "prompt_embeds", true) => data::check(v.bytes, n, 0),
            (_, "latents", true) => data::check(v.bytes, n, 1),
            (_, "latents", false) => data::check_denoised(v.bytes, n),
            _ => Some(0),
        };
        if let Some(at) = at {
            bad = Some((v.field.raw().to_owned(), at));
        }
    }
    let tensors = match workload {
        Workload::Pipeline if forward => 2,
        _ => 1,
    };
    if seen != tensors {
        bad = Some(("manifest".to_owned(), 0));
    }
    bad
}

/// Denoisers and the decoder: receive, check every byte, record the hand-off
/// latency; with the pipeline's workload, denoisers transform and forward
/// the latents under the same id.
fn serve(
    node: &InstanceNode,
    ending: &mut Ending<'_>,
    tally: &mut Tally,
    forward: bool,
    hold: Duration,
    workload: Workload,
) -> Result<(), NodeError> {
    while ending.keep_going() {
        drain_outcomes(node, tally, Duration::ZERO);
        let Some(d) = node.recv(Duration::from_millis(20)) else {
            continue;
        };
        tally.received += 1;
        let now = d
            .arrived()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64);
        let (n, t) = (
            scalar_u64(d.scalar_fields(), "n"),
            scalar_u64(d.scalar_fields(), "t_commit_ns"),
        );
        let Some(n) = n else {
            tally.mismatches += 1;
            d.fail("no request number in scalar_fields");
            continue;
        };
        if let Some(t) = t {
            tally.latencies_us.push(now.saturating_sub(t) / 1000);
        }
        if let Some((field, at)) = verify(&d, n, workload, forward) {
            tally.mismatches += 1;
            emit_json(&json!({"event": "mismatch", "id": d.id(), "field": field, "byte": at}));
            d.fail("byte mismatch");
            continue;
        }
        tally.verified += 1;
        if !hold.is_zero() {
            ending.sleep(hold);
        }
        if !forward {
            d.release();
            continue;
        }
        // Forward before letting go of the input, as a denoiser would.
        let id = d.id().to_owned();
        match forward_denoised(node, d, n, &scalars(n), &|| ending.patient()) {
            Ok(()) => tally.forwarded += 1,
            Err(e) => {
                tally.forward_failed += 1;
                emit_json(&json!({"event": "forward_failed", "id": id, "error": e.to_string()}));
            }
        }
    }
    Ok(())
}
