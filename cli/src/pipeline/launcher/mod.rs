//! The pipeline's launcher: starts the coordinator and the instances as
//! separate processes, follows every request to its end through the
//! coordinator's reports, optionally kills a denoiser mid-run, then stops
//! everyone, collects their summaries, removes what dead processes left in
//! shared memory, and prints the summary table.
//!
//! Modules: the processes a run starts and owns (`processes`), and what
//! the run found, printed (`summary`).

mod processes;
mod summary;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tensorferry_core::json::RawJson;

use super::data;
use processes::{coordinator_keys, fresh_dir, instance_keys, make_keys, shm_objects, Run};
use summary::data_plane_name;
pub use summary::{json, table, Leg, Summary};

/// What to run.
#[derive(Clone, Debug)]
pub struct LaunchArgs {
    /// Requests the encoder sends.
    pub requests: u64,
    /// Denoiser processes.
    pub denoisers: usize,
    /// Requests in flight from the encoder.
    pub window: usize,
    /// Kill this denoiser (by number) with SIGKILL once this many requests
    /// reached the decoder.
    pub kill: Option<(usize, u64)>,
    /// Give up after this long.
    pub timeout: Duration,
    /// The coordinator's push timeout.
    pub push_timeout: Duration,
    /// Print the summary as JSON.
    pub json: bool,
    /// The control plane between the processes.
    pub control: super::Control,
    /// The data-plane options each instance gets (`DataPlaneArgs::to_args`).
    pub data_plane: Vec<String>,
    /// Serve each process's metrics: the coordinator at this address, the
    /// instances at the ports after it (port 0: each picks its own).
    pub metrics_listen: Option<String>,
    /// Run the control plane over CurveZMQ, with a key pair per process
    /// made in the run's directory (removed with it).
    pub curve: bool,
    /// How to start this program again as a pipeline process.
    pub exe: PathBuf,
    /// Arguments before the role arguments (`pipeline` for the `ferry`
    /// binary, none for the example).
    pub prefix: Vec<String>,
}

/// The address `--metrics-listen` names.
pub fn metrics_address(listen: &str) -> Result<std::net::SocketAddr, String> {
    crate::metrics_http::listen_address(listen)
}

fn get<'a>(obj: RawJson<'a>, key: &str) -> Option<&'a str> {
    obj.get(key).map(|v| v.as_str().trim_matches('"'))
}

fn num(obj: RawJson<'_>, key: &str) -> u64 {
    get(obj, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// What the coordinator reported of one leg's deliveries: how long each
/// waited for a slot, and how long its bytes moved, µs.
#[derive(Default)]
struct LegTimes {
    queued_us: Vec<u64>,
    written_us: Vec<u64>,
}

impl LegTimes {
    /// Takes a `delivered` line's figures (none under a coordinator that
    /// reports none).
    fn record(&mut self, obj: RawJson<'_>) {
        let us = |key| get(obj, key).and_then(|v| v.parse::<u64>().ok());
        if let (Some(q), Some(w)) = (us("queued_us"), us("written_us")) {
            self.queued_us.push(q);
            self.written_us.push(w);
        }
    }

    /// The leg's medians and 99th percentiles, its request's bytes and
    /// memcpy's rate for as many.
    fn leg(&mut self, bytes: u64, memcpy_gbps: f64) -> Leg {
        let p = |v: &mut Vec<u64>| {
            v.sort_unstable();
            (!v.is_empty()).then(|| (percentile(v, 0.5), percentile(v, 0.99)))
        };
        Leg {
            waiting_us: p(&mut self.queued_us),
            moving_us: p(&mut self.written_us),
            bytes,
            memcpy_gbps,
        }
    }
}

/// A single-thread memcpy of `bytes` between two private buffers touched
/// beforehand: its median rate over a few copies, GB/s.
fn memcpy_gbps(bytes: u64) -> f64 {
    let len = usize::try_from(bytes).unwrap_or(0).max(1);
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src);
    let mut ns: Vec<u64> = (0..7)
        .map(|_| {
            let t0 = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            t0.elapsed().as_nanos() as u64
        })
        .collect();
    ns.sort_unstable();
    len as f64 / percentile(&ns, 0.5).max(1) as f64
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The value the data-plane arguments `args` give `flag`.
fn plane_flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// Runs the pipeline.
pub fn launch(args: LaunchArgs) -> Result<Summary, String> {
    let pid = std::process::id();
    let dir = fresh_dir(&format!("ferry-pipeline-{pid}"))?;
    let (tx, rx) = mpsc::channel();
    let mut run = Run {
        args: args.clone(),
        procs: Vec::new(),
        tx,
        rx,
        dir,
        prefix: format!("{}-pl{pid}", tensorferry_shm::prefix()),
    };
    let boot = Duration::from_secs(30);
    let listen: Vec<String> = match args.control {
        super::Control::Uds => vec![run.endpoint("coordinator")],
        super::Control::Zmq => super::PIPELINE
            .iter()
            .map(|r| run.result_endpoint(r))
            .collect(),
    };
    let coord_args = [
        "--control".to_owned(),
        run.control_arg().to_owned(),
        "--role".to_owned(),
        "coordinator".to_owned(),
        "--endpoint".to_owned(),
        listen.join(","),
        "--push-timeout-ms".to_owned(),
        args.push_timeout.as_millis().to_string(),
    ];
    let mut coord_args = coord_args.to_vec();
    if args.curve {
        let mut names: Vec<String> = (0..args.denoisers)
            .map(|d| format!("denoiser-{d}"))
            .collect();
        names.extend(["decoder".to_owned(), "encoder".to_owned()]);
        make_keys(&run.dir, &names)?;
        coord_args.extend([
            "--curve-key".to_owned(),
            coordinator_keys(&run.dir)
                .join("coordinator.key_secret")
                .display()
                .to_string(),
            "--curve-peers".to_owned(),
            instance_keys(&run.dir).display().to_string(),
        ]);
    }
    let c = run.spawn("coordinator", &coord_args)?;
    run.expect(&[c], "ready", boot)?;
    let mut receivers = Vec::new();
    for d in 0..args.denoisers {
        receivers.push(run.instance("denoiser", &format!("denoiser-{d}"))?);
    }
    receivers.push(run.instance("decoder", "decoder")?);
    // Each receiver says the quarantine it runs with (raised to cover its
    // data plane's write lifetime): the longest is waited out after
    // failures, before slots are counted.
    let mut quarantine = Duration::ZERO;
    for (j, line) in run.expect(&receivers, "registered", boot)? {
        let ms = RawJson::parse_object(&line)
            .ok()
            .and_then(|obj| get(obj, "quarantine_ms"))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                format!(
                    "{}: its registered line names no quarantine_ms: {line}",
                    run.procs[j].name
                )
            })?;
        quarantine = quarantine.max(Duration::from_millis(ms));
    }
    let start = Instant::now();
    let enc = run.instance("encoder", "encoder")?;

    // Follow every request to its end, as the coordinator reports it.
    let mut ended: HashSet<String> = HashSet::new();
    let mut reasons: HashMap<(usize, String), u64> = HashMap::new();
    let (mut delivered, mut failed, mut mismatches) = (0u64, 0u64, 0u64);
    // Per leg, as the coordinator reports each delivery.
    let mut timings = [LegTimes::default(), LegTimes::default()];
    let mut killed = None;
    let mut errors = Vec::new();
    let deadline = start + args.timeout;
    while (ended.len() as u64) < args.requests && Instant::now() < deadline {
        let Ok((i, line)) = run.rx.recv_timeout(Duration::from_millis(100)) else {
            if matches!(run.procs[enc].child.try_wait(), Ok(Some(_))) {
                errors.push("the encoder exited early".to_owned());
                break;
            }
            continue;
        };
        let Ok(obj) = RawJson::parse_object(&line) else {
            continue;
        };
        match get(obj, "event") {
            Some("delivered") if i == c => {
                let leg = num(obj, "leg") as usize;
                if let Some(t) = timings.get_mut(leg) {
                    t.record(obj);
                }
                if leg != 1 {
                    continue;
                }
                if let Some(id) = get(obj, "id") {
                    if ended.insert(id.to_owned()) {
                        delivered += 1;
                    }
                }
            }
            Some("failed") if i == c => {
                let leg = num(obj, "leg") as usize;
                let reason = get(obj, "reason").unwrap_or("").to_owned();
                if let Some(id) = get(obj, "id") {
                    if ended.insert(id.to_owned()) {
                        failed += 1;
                        *reasons.entry((leg, reason)).or_default() += 1;
                    }
                }
            }
            Some("mismatch") => mismatches += 1,
            Some("error") => errors.push(format!("{}: {line}", run.procs[i].name)),
            Some("metrics") => run.metrics_at(i, &line),
            _ => {}
        }
        if let Some((d, after)) = args.kill {
            if killed.is_none() && delivered >= after {
                let name = format!("denoiser-{d}");
                if let Some(p) = run.procs.iter_mut().find(|p| p.name == name) {
                    let _ = p.child.kill();
                    let _ = p.child.wait();
                    p.alive = false;
                    killed = Some(name);
                }
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let incomplete = (ended.len() as u64) < args.requests;
    if failed > 0 {
        // Slots of failed requests stay out of use for the quarantine (a
        // late write could still land) before they count as free again.
        std::thread::sleep(quarantine + Duration::from_millis(500));
    }
    let summaries = run.stop_all();
    let cleaned = tensorferry_shm::clean_stale_with_prefix(&run.prefix).len();
    let shm_left = shm_objects(&run.prefix);

    let mut lat = [Vec::new(), Vec::new()];
    let mut leaks = Vec::new();
    let mut reported_mismatches = 0;
    for (name, line) in &summaries {
        let Ok(obj) = RawJson::parse_object(line) else {
            continue;
        };
        reported_mismatches += num(obj, "mismatches");
        let role = get(obj, "role").unwrap_or("");
        if role == "coordinator" {
            if num(obj, "in_flight") != 0 || num(obj, "prealloc_taken") != 0 {
                leaks.push(format!("{name}: {line}"));
            }
            continue;
        }
        if num(obj, "requests_held") != 0 || num(obj, "live_slots") != num(obj, "prealloc_slots") {
            leaks.push(format!("{name}: {line}"));
        }
        let leg = match role {
            "denoiser" => Some(0),
            "decoder" => Some(1),
            _ => None,
        };
        if let (Some(leg), Some(list)) = (leg, obj.get("latencies_us")) {
            let inner = list.as_str().trim_matches(['[', ']']);
            lat[leg].extend(
                inner
                    .split(',')
                    .filter_map(|v| v.trim().parse::<u64>().ok()),
            );
        }
    }
    let mismatches = mismatches.max(reported_mismatches);
    let latency_us = lat.map(|mut l| {
        l.sort_unstable();
        (percentile(&l, 0.5), percentile(&l, 0.99))
    });
    let leg0_bytes: u64 = data::encoder_tensors().iter().map(|t| t.byte_len).sum();
    let leg1_bytes: u64 = data::denoiser_tensors().iter().map(|t| t.byte_len).sum();
    let leg_bytes = [leg0_bytes, leg1_bytes];
    let legs =
        std::array::from_fn(|leg| timings[leg].leg(leg_bytes[leg], memcpy_gbps(leg_bytes[leg])));
    let leg0_done = delivered
        + reasons
            .iter()
            .filter(|((l, _), _)| *l == 1)
            .map(|(_, n)| n)
            .sum::<u64>();
    let mut reasons: Vec<_> = reasons.into_iter().map(|((l, r), n)| (l, r, n)).collect();
    reasons.sort();
    if !errors.is_empty() {
        return Err(errors.join("\n"));
    }
    Ok(Summary {
        data_plane: if args.curve {
            format!(
                "{}, control over CurveZMQ",
                data_plane_name(&args.data_plane)
            )
        } else {
            data_plane_name(&args.data_plane)
        },
        requests: args.requests,
        delivered,
        failed,
        reasons,
        bytes: leg0_done * leg0_bytes + delivered * leg1_bytes,
        seconds,
        latency_us,
        legs,
        mismatches,
        leaks,
        shm_left,
        shm_cleaned: cleaned,
        killed,
        incomplete,
    })
}
