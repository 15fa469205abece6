//! An instance process: its node on the chosen data plane and control
//! plane, and its run (the pipeline's workload, or sglang's) until a stop.

use super::*;
use tensorferry_zmq::zmq;

/// An instance process: its node's configuration extended with where it
/// binds, its data and control planes, and its run.
#[derive(Clone, Debug)]
pub struct InstanceProcessConfig {
    /// The node's configuration: its role (`encoder`, `denoiser` or
    /// `decoder`), its coordinator's endpoint, and how it behaves (the
    /// head it serves under and the timeouts that follow from it, its
    /// preallocated slots: `role_prealloc` unless the command says).
    pub node: InstanceNodeConfig,
    /// Its name in reports (`denoiser-1`).
    pub name: String,
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
    /// The encoder's pause between requests.
    pub pace: Duration,
    /// How long a denoiser or decoder works on each request (holding it)
    /// before it forwards and releases it.
    pub hold: Duration,
    /// The data plane.
    pub data_plane: DataPlane,
    /// What to send and check.
    pub workload: Workload,
    /// Where to serve Prometheus metrics (`host:port`), if anywhere.
    pub metrics_listen: Option<String>,
    /// Who may connect to its ZeroMQ endpoints (addresses, CURVE keys);
    /// the data plane was given the same (`DataPlane::guard`).
    pub guard: tensorferry_zmq::Guard,
    /// Stop when stdin closes, as well as on SIGTERM or SIGINT.
    pub exit_on_stdin_close: bool,
    /// How long a stop waits for what is in flight to end before it fails
    /// it.
    pub drain_timeout: Duration,
}

/// Counts and latencies an instance reports.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) received: u64,
    pub(super) verified: u64,
    pub(super) mismatches: u64,
    pub(super) forwarded: u64,
    pub(super) forward_failed: u64,
    /// Requests committed (announced to the coordinator).
    pub(super) staged: u64,
    pub(super) sent: u64,
    pub(super) send_failed: u64,
    /// Why requests were not sent, with how many each.
    pub(super) failures: std::collections::BTreeMap<String, u64>,
    pub(super) latencies_us: Vec<u64>,
}

/// Removes the pools of processes that died without removing them (SIGKILL,
/// a crash), and says which: what a restarted process finds of its
/// predecessor.
pub(super) fn remove_stale_pools() {
    let removed = tensorferry_shm::clean_stale();
    if !removed.is_empty() {
        emit_json(&json!({"event": "stale_pools_removed", "objects": removed}));
    }
}

/// The preallocated receive slots a role gets when the command names none:
/// four of 16 MiB for the roles that receive; the encoder keeps its
/// configuration's (none).
pub fn role_prealloc(role: &str) -> Option<Prealloc> {
    (role != "encoder").then_some(Prealloc {
        count: 4,
        size: 16 << 20,
    })
}

/// Runs an instance until it is stopped (SIGTERM, SIGINT, or stdin's end
/// if asked).
pub fn instance(args: &InstanceProcessConfig) -> ExitCode {
    let life = match lifetime(args.exit_on_stdin_close) {
        Ok(l) => l,
        Err(code) => return code,
    };
    remove_stale_pools();
    let settings = &args.node;
    let mut pool: usize = match settings.role.as_str() {
        "denoiser" => 512 << 20,
        _ => 256 << 20,
    };
    if let Workload::Random { max_bytes, .. } = args.workload {
        match random_pool(settings, max_bytes, args.pool_mib, pool) {
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
        let role = match SglangRole::from_name(&args.node.role) {
            Ok(r) => r,
            Err(e) => return fail("start instance", e),
        };
        let channel = match bind_zmq(args) {
            Ok(c) => c,
            Err(code) => return code,
        };
        return match plane.start_instance(settings, pool, channel) {
            Ok(node) => run_sglang(&node, args, role, &life),
            Err(e) => fail("start instance", e),
        };
    }
    match args.control {
        Control::Uds if !plane.needs_zmq() => {
            match plane.start_instance_at(settings, pool, &args.endpoint) {
                Ok(node) => run_instance(&node, args, &life),
                Err(e) => fail("start instance", e),
            }
        }
        _ => {
            let channel = match bind_zmq(args) {
                Ok(c) => c,
                Err(code) => return code,
            };
            match plane.start_instance(settings, pool, channel) {
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
pub(super) fn random_pool(
    settings: &InstanceNodeConfig,
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
pub(super) fn bind_zmq(args: &InstanceProcessConfig) -> Result<ZmqChannel, ExitCode> {
    if args.control != Control::Zmq && args.data_plane.needs_zmq() {
        return Err(fail(
            "start instance",
            "the libfabric and verbs data planes pair with the ZeroMQ control plane (--control zmq)",
        ));
    }
    let ctx = zmq::Context::new();
    ZmqChannel::bind_guarded(&ctx, &[&args.endpoint], ZmqConfig::default(), &args.guard)
        .map_err(|e| fail("bind", e))
}

/// Starts serving (see [`start_serving`]) and runs `work` with the way
/// out, the metrics server kept until it returns the exit code; the exit
/// code of a start that failed or was stopped first otherwise.
fn serving<'n>(
    node: &'n InstanceNode,
    args: &InstanceProcessConfig,
    life: &'n Lifetime,
    work: impl FnOnce(&mut Ending<'n>) -> ExitCode,
) -> ExitCode {
    match start_serving(node, args, life) {
        Ok((_metrics, mut ending)) => work(&mut ending),
        Err(code) => code,
    }
}

/// Serves metrics and probes for an instance (if asked), waits for its
/// registration and gives its metrics server (kept while it runs) and its
/// way out; `Err` holds the exit code when that failed or a stop came
/// first.
fn start_serving<'n>(
    node: &'n InstanceNode,
    args: &InstanceProcessConfig,
    life: &'n Lifetime,
) -> Result<(Option<MetricsServer>, Ending<'n>), ExitCode> {
    let ready = Readiness::new();
    let metrics = serve_metrics(args.metrics_listen.as_deref(), &ready, |t| {
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
        "quarantine_ms": u64::try_from(node.quarantine().as_millis()).unwrap_or(u64::MAX),
    }));
    Ok((metrics, Ending::new(life, node, args.drain_timeout, ready)))
}

/// Runs an instance of the sglang workload until it is stopped.
pub(super) fn run_sglang(
    node: &InstanceNode,
    args: &InstanceProcessConfig,
    role: SglangRole,
    life: &Lifetime,
) -> ExitCode {
    serving(node, args, life, |ending| {
        let mut tally = SglangTally::default();
        sglang::run(node, role, ending, &mut tally);
        let stop = ending.leave();
        let s = node.stats();
        emit_json(&json!({
            "event": "summary",
            "role": args.node.role,
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
    })
}

pub(super) fn run_instance(
    node: &InstanceNode,
    args: &InstanceProcessConfig,
    life: &Lifetime,
) -> ExitCode {
    serving(node, args, life, |ending| {
        let mut tally = Tally::default();
        let result = match (args.node.role.as_str(), args.workload) {
            ("encoder", _) => encode(node, args, ending, &mut tally),
            // The random workload ends at its first receiver.
            ("denoiser", Workload::Pipeline) => {
                serve(node, ending, &mut tally, true, args.hold, args.workload)
            }
            _ => serve(node, ending, &mut tally, false, args.hold, args.workload),
        };
        if let Err(e) = result {
            ending.leave();
            return fail(&args.node.role, e);
        }
        while ending.keep_going() {
            drain_outcomes(node, &mut tally, Duration::from_millis(20));
        }
        let stop = ending.leave();
        while drain_outcomes(node, &mut tally, Duration::ZERO) {}
        let s = node.stats();
        emit_json(&json!({
            "event": "summary",
            "role": args.node.role,
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
    })
}

pub(super) fn drain_outcomes(node: &InstanceNode, tally: &mut Tally, wait: Duration) -> bool {
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

/// Denoisers and the decoder: receive, check every byte, record the hand-off
/// latency; with the pipeline's workload, denoisers transform and forward
/// the latents under the same id.
pub(super) fn serve(
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
