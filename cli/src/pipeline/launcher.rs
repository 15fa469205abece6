//! The pipeline's launcher: starts the coordinator and the instances as
//! separate processes, follows every request to its end through the
//! coordinator's reports, optionally kills a denoiser mid-run, then stops
//! everyone, collects their summaries, removes what dead processes left in
//! shared memory, and prints the summary table.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tensorferry_core::json::RawJson;

use super::data;

/// The quarantine of the pipeline's coordinator and instances (ferry's
/// default).
const QUARANTINE: Duration = Duration::from_secs(1);

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
    listen.parse().map_err(|e| {
        format!("--metrics-listen {listen:?} is not an address:port (e.g. 127.0.0.1:9464): {e}")
    })
}

/// What a run found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// The data plane the bytes moved over (`shared-memory loopback`,
    /// `libfabric shm`, ...).
    pub data_plane: String,
    /// Requests sent.
    pub requests: u64,
    /// Requests that reached the decoder with every byte right.
    pub delivered: u64,
    /// Requests that failed on the way (with the reasons, by leg).
    pub failed: u64,
    /// Failure reasons: (leg, reason) → count.
    pub reasons: Vec<(usize, String, u64)>,
    /// Bytes moved over both legs.
    pub bytes: u64,
    /// Wall time from the first request to the last end.
    pub seconds: f64,
    /// Hand-off latency p50 and p99 per leg, µs.
    pub latency_us: [(u64, u64); 2],
    /// Bytes that were not what was sent.
    pub mismatches: u64,
    /// Surviving instances that still hold slots or requests.
    pub leaks: Vec<String>,
    /// Shared-memory objects left behind after cleanup.
    pub shm_left: usize,
    /// Objects that killed processes left, removed by the cleanup.
    pub shm_cleaned: usize,
    /// A process was killed on purpose.
    pub killed: Option<String>,
    /// The run ended before every request did.
    pub incomplete: bool,
}

impl Summary {
    /// True if the run is what a correct system produces: every request
    /// ended, no byte was wrong, nothing leaked, nothing was left in shared
    /// memory, and requests failed only where a process was killed.
    pub fn ok(&self) -> bool {
        !self.incomplete
            && self.mismatches == 0
            && self.leaks.is_empty()
            && self.shm_left == 0
            && (self.failed == 0 || self.killed.is_some())
            && self.delivered + self.failed == self.requests
    }
}

struct Proc {
    name: String,
    child: Child,
    alive: bool,
}

fn get<'a>(obj: RawJson<'a>, key: &str) -> Option<&'a str> {
    obj.get(key).map(|v| v.as_str().trim_matches('"'))
}

fn num(obj: RawJson<'_>, key: &str) -> u64 {
    get(obj, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Where the pipeline's processes report.
type Lines = mpsc::Receiver<(usize, String)>;

struct Run {
    args: LaunchArgs,
    procs: Vec<Proc>,
    tx: mpsc::Sender<(usize, String)>,
    rx: Lines,
    dir: PathBuf,
    prefix: String,
}

/// Where the run's CURVE certificates are: the coordinator's in one
/// directory, the instances' in another (which the coordinator admits).
fn coordinator_keys(dir: &Path) -> PathBuf {
    dir.join("keys").join("coordinator")
}

fn instance_keys(dir: &Path) -> PathBuf {
    dir.join("keys").join("instances")
}

/// Makes a key pair for the coordinator and for each of `instances`.
fn make_keys(dir: &Path, instances: &[String]) -> Result<(), String> {
    let pair = || tensorferry_zmq::CurveKeyPair::generate().map_err(|e| format!("CURVE key: {e}"));
    tensorferry_zmq::write_certificates(&coordinator_keys(dir), "coordinator", &pair()?)
        .map_err(|e| e.to_string())?;
    for name in instances {
        tensorferry_zmq::write_certificates(&instance_keys(dir), name, &pair()?)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl Run {
    fn spawn(&mut self, name: &str, role_args: &[String]) -> Result<usize, String> {
        let mut metrics = Vec::new();
        if let Some(listen) = &self.args.metrics_listen {
            let mut addr = metrics_address(listen)?;
            if addr.port() != 0 {
                let port = u16::try_from(usize::from(addr.port()) + self.procs.len())
                    .map_err(|_| format!("no port for {name}'s metrics after {listen}"))?;
                addr.set_port(port);
            }
            metrics = vec!["--metrics-listen".to_owned(), addr.to_string()];
        }
        let mut child = Command::new(&self.args.exe)
            .args(&self.args.prefix)
            .args(role_args)
            .args(&metrics)
            // Its children stop when it closes their stdin.
            .arg("--exit-on-stdin-close")
            .env("FERRY_SHM_PREFIX", &self.prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        let i = self.procs.len();
        let out = child.stdout.take().ok_or("no stdout")?;
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((i, line)).is_err() {
                    break;
                }
            }
        });
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
            alive: true,
        });
        Ok(i)
    }

    fn endpoint(&self, name: &str) -> String {
        format!("ipc://{}/{name}.sock", self.dir.display())
    }

    /// Waits for `event` from each of `procs`.
    fn expect(&self, procs: &[usize], event: &str, within: Duration) -> Result<(), String> {
        let end = Instant::now() + within;
        let mut waiting: Vec<usize> = procs.to_vec();
        let tag = format!(r#""event":"{event}""#);
        while !waiting.is_empty() {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((j, line)) if line.contains(&tag) => waiting.retain(|&w| w != j),
                Ok((j, line)) if line.contains(r#""event":"metrics""#) => self.metrics_at(j, &line),
                Ok((j, line)) if line.contains(r#""event":"error""#) => {
                    return Err(format!("{}: {line}", self.procs[j].name))
                }
                Ok(_) => {}
                Err(_) => {
                    let names: Vec<&str> = waiting
                        .iter()
                        .map(|&w| self.procs[w].name.as_str())
                        .collect();
                    return Err(format!("{} did not report {event}", names.join(", ")));
                }
            }
        }
        Ok(())
    }

    /// Says where process `j` serves its metrics (its `metrics` line).
    fn metrics_at(&self, j: usize, line: &str) {
        if let Some(url) = RawJson::parse_object(line).ok().and_then(|o| get(o, "url")) {
            eprintln!(
                "pipeline: {} serves its metrics at {url}",
                self.procs[j].name
            );
        }
    }

    /// Where instances of `role` report to the coordinator.
    fn result_endpoint(&self, role: &str) -> String {
        match self.args.control {
            super::Control::Uds => self.endpoint("coordinator"),
            super::Control::Zmq => self.endpoint(&format!("coordinator-{role}")),
        }
    }

    fn control_arg(&self) -> &'static str {
        match self.args.control {
            super::Control::Uds => "uds",
            super::Control::Zmq => "zmq",
        }
    }

    fn instance(&mut self, role: &str, name: &str) -> Result<usize, String> {
        let a = [
            "--control",
            self.control_arg(),
            "--role",
            role,
            "--name",
            name,
            "--coordinator",
            &self.result_endpoint(role),
            "--endpoint",
            &self.endpoint(name),
            "--requests",
            &self.args.requests.to_string(),
            "--window",
            &self.args.window.to_string(),
        ]
        .map(str::to_owned);
        let mut a: Vec<String> = a
            .into_iter()
            .chain(self.args.data_plane.iter().cloned())
            .collect();
        if self.args.curve {
            let key = instance_keys(&self.dir).join(format!("{name}.key_secret"));
            let coordinator = coordinator_keys(&self.dir).join("coordinator.key");
            a.extend([
                "--curve-key".to_owned(),
                key.display().to_string(),
                "--curve-peers".to_owned(),
                coordinator.display().to_string(),
            ]);
            if plane_flag(&self.args.data_plane, "--backend") == Some("verbs") {
                // Every instance may write into every other one.
                a.extend([
                    "--plane-option".to_owned(),
                    format!("writers={}", instance_keys(&self.dir).display()),
                ]);
            }
        }
        self.spawn(name, &a)
    }

    fn stop_all(&mut self) -> Vec<(String, String)> {
        let mut summaries = Vec::new();
        for p in &mut self.procs {
            // Closing stdin asks it to finish.
            drop(p.child.stdin.take());
        }
        let end = Instant::now() + Duration::from_secs(20);
        while self.procs.iter().any(|p| p.alive) && Instant::now() < end {
            if let Ok((i, line)) = self.rx.recv_timeout(Duration::from_millis(50)) {
                if line.contains(r#""event":"summary""#) {
                    summaries.push((self.procs[i].name.clone(), line));
                }
            }
            for p in &mut self.procs {
                if p.alive && matches!(p.child.try_wait(), Ok(Some(_))) {
                    p.alive = false;
                }
            }
        }
        // Lines written just before exiting.
        while let Ok((i, line)) = self.rx.recv_timeout(Duration::from_millis(100)) {
            if line.contains(r#""event":"summary""#) {
                summaries.push((self.procs[i].name.clone(), line));
            }
        }
        for p in &mut self.procs {
            if p.alive {
                let _ = p.child.kill();
                let _ = p.child.wait();
                p.alive = false;
            }
        }
        summaries
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if p.alive {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
        // What killed processes left (a no-op after a clean run).
        tensorferry_shm::clean_stale_with_prefix(&self.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Shared-memory objects whose names start with `prefix`.
fn shm_objects(prefix: &str) -> usize {
    std::fs::read_dir("/dev/shm").map_or(0, |d| {
        d.flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
            })
            .count()
    })
}

/// The value the data-plane arguments `args` give `flag`.
fn plane_flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// How the summary names the data plane the instances were given.
fn data_plane_name(args: &[String]) -> String {
    let value = |flag: &str| plane_flag(args, flag);
    match value("--backend") {
        Some("fabric") => format!("libfabric {}", value("--provider").unwrap_or("auto")),
        Some("verbs") => format!("ibverbs {}", value("--device").unwrap_or("?")),
        None | Some("shm") => "shared-memory loopback".to_owned(),
        // A data plane the summary has no words for goes by its name.
        Some(other) => other.to_owned(),
    }
}

/// Runs the pipeline.
pub fn launch(args: LaunchArgs) -> Result<Summary, String> {
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("ferry-pipeline-{pid}"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
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
    run.expect(&receivers, "registered", boot)?;
    let start = Instant::now();
    let enc = run.instance("encoder", "encoder")?;

    // Follow every request to its end, as the coordinator reports it.
    let mut ended: HashSet<String> = HashSet::new();
    let mut reasons: HashMap<(usize, String), u64> = HashMap::new();
    let (mut delivered, mut failed, mut mismatches) = (0u64, 0u64, 0u64);
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
            Some("delivered") if i == c && num(obj, "leg") == 1 => {
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
        std::thread::sleep(QUARANTINE + Duration::from_millis(500));
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
        mismatches,
        leaks,
        shm_left,
        shm_cleaned: cleaned,
        killed,
        incomplete,
    })
}

/// The summary as a table.
pub fn table(s: &Summary) -> String {
    let mut out = String::new();
    let gbps = s.bytes as f64 / s.seconds / 1e9;
    out.push_str(&format!(
        "pipeline: encoder → denoisers → decoder, separate processes, {}\n",
        s.data_plane
    ));
    out.push_str(&format!("  requests            {}\n", s.requests));
    out.push_str(&format!("  delivered, verified {}\n", s.delivered));
    out.push_str(&format!("  failed              {}\n", s.failed));
    for (leg, reason, n) in &s.reasons {
        out.push_str(&format!("    leg {leg}: {reason} × {n}\n"));
    }
    out.push_str(&format!(
        "  bytes moved         {:.1} MiB in {:.2} s ({gbps:.2} GB/s)\n",
        s.bytes as f64 / (1u64 << 20) as f64,
        s.seconds
    ));
    for (leg, name) in ["encoder → denoiser", "denoiser → decoder"]
        .iter()
        .enumerate()
    {
        let (p50, p99) = s.latency_us[leg];
        out.push_str(&format!(
            "  hand-off latency    {name}: p50 {p50} µs, p99 {p99} µs\n"
        ));
    }
    out.push_str(&format!("  byte mismatches     {}\n", s.mismatches));
    out.push_str(&format!("  slot leaks          {}\n", s.leaks.len()));
    for l in &s.leaks {
        out.push_str(&format!("    {l}\n"));
    }
    if let Some(k) = &s.killed {
        out.push_str(&format!(
            "  killed              {k} (SIGKILL); its {} shared-memory object(s) cleaned\n",
            s.shm_cleaned
        ));
    }
    out.push_str(&format!("  shm objects left    {}\n", s.shm_left));
    if s.incomplete {
        out.push_str("  INCOMPLETE: not every request ended in time\n");
    }
    out.push_str(if s.ok() {
        "  result              ok\n"
    } else {
        "  result              FAILED\n"
    });
    out
}

/// The summary as one JSON object.
pub fn json(s: &Summary) -> String {
    let reasons: Vec<serde_json::Value> = s
        .reasons
        .iter()
        .map(|(l, r, n)| serde_json::json!({"leg": l, "reason": r, "count": n}))
        .collect();
    serde_json::json!({
        "ok": s.ok(),
        "requests": s.requests,
        "delivered": s.delivered,
        "failed": s.failed,
        "reasons": reasons,
        "bytes": s.bytes,
        "seconds": (s.seconds * 1000.0).round() / 1000.0,
        "leg0_p50_us": s.latency_us[0].0,
        "leg0_p99_us": s.latency_us[0].1,
        "leg1_p50_us": s.latency_us[1].0,
        "leg1_p99_us": s.latency_us[1].1,
        "mismatches": s.mismatches,
        "leaks": s.leaks.len(),
        "shm_left": s.shm_left,
        "shm_cleaned": s.shm_cleaned,
        "killed": s.killed,
        "incomplete": s.incomplete,
    })
    .to_string()
}
