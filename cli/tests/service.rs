//! `ferry coordinator` and `ferry instance` run as services run them: each
//! in a session of its own (`setsid`), stdin at `/dev/null` (systemd's
//! default, a container without `-i`, Kubernetes), ready when `/readyz`
//! says so, and stopped with SIGTERM in the middle of a run. Each must then
//! drain, exit 0 with its summary, leave nothing in `/dev/shm`, and leave
//! no request unanswered at the coordinator or the peers.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// One `ferry` process started as a daemon.
struct Daemon {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Lines read while waiting for another.
    seen: Vec<Value>,
    pid: Option<u32>,
}

impl Daemon {
    /// `ferry <args>` under `setsid --wait` (its own session; the exit
    /// status is ferry's), stdin at /dev/null, stdout read line by line.
    fn start(name: &str, shm_prefix: &str, args: &[&str]) -> Self {
        let mut cmd = Command::new("setsid");
        cmd.arg("--wait")
            .arg(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .env("FERRY_SHM_PREFIX", shm_prefix)
            .env("FI_TCP_IFACE", "lo")
            .stdin(Stdio::null());
        let (tx, lines) = mpsc::channel();
        let child = common::spawn_reading(&mut cmd, &format!("{name} under setsid"), move |line| {
            let _ = tx.send(line);
        });
        Self {
            name: name.to_owned(),
            child,
            lines,
            seen: Vec::new(),
            pid: None,
        }
    }

    /// The first event `event` (taken from the lines read so far, or
    /// waited for up to `secs`).
    fn wait_for(&mut self, event: &str, secs: u64) -> Value {
        if let Some(i) = self.seen.iter().position(|v| v["event"] == event) {
            return self.seen.remove(i);
        }
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("{} did not print {event}: {:?}", self.name, self.seen));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line}", self.name));
            if let Some(pid) = v["pid"].as_u64() {
                self.pid = Some(pid as u32);
            }
            assert_ne!(v["event"], "error", "{}: {line}", self.name);
            if v["event"] == event {
                return v;
            }
            self.seen.push(v);
        }
    }

    /// Every line read so far and until now of event `event`.
    fn count(&mut self, event: &str) -> usize {
        while let Ok(line) = self.lines.try_recv() {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                self.seen.push(v);
            }
        }
        self.seen.iter().filter(|v| v["event"] == event).count()
    }

    /// Sends `signal` (`TERM`, `INT`) to the ferry process.
    fn signal(&self, signal: &str) {
        let pid = self.pid.expect("the process printed its pid").to_string();
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {} ({pid})", self.name);
    }

    /// Waits up to `secs` for the process to exit; its exit code.
    fn exit_code(&mut self, secs: u64) -> i32 {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < end, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the summary and exit 0 within `secs`.
    fn stop(&mut self, secs: u64) -> Value {
        self.signal("TERM");
        let summary = self.wait_for("summary", secs);
        assert_eq!(self.exit_code(secs), 0, "{}: {summary}", self.name);
        assert_eq!(summary["stop"]["cause"], "SIGTERM", "{summary}");
        summary
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test's leftovers: the ferry process, then setsid.
        if self.child.try_wait().ok().flatten().is_none() {
            if let Some(pid) = self.pid {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What `/readyz` at the metrics URL a process printed answers: the HTTP
/// status.
fn readyz(metrics: &Value) -> u16 {
    let url = metrics["url"]
        .as_str()
        .unwrap()
        .replace("/metrics", "/readyz");
    match ureq::get(&url).call() {
        Ok(r) => r.status().as_u16(),
        Err(ureq::Error::StatusCode(code)) => code,
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Waits for `/readyz` to answer 200, then for the event that says the
/// process is up (`ready` of a coordinator, `registered` of an instance);
/// returns where its metrics are.
fn wait_ready(d: &mut Daemon, up: &str) -> Value {
    let metrics = d.wait_for("metrics", 30);
    let end = Instant::now() + Duration::from_secs(30);
    while readyz(&metrics) != 200 {
        assert!(Instant::now() < end, "{} never became ready", d.name);
        std::thread::sleep(Duration::from_millis(50));
    }
    d.wait_for(up, 30);
    metrics
}

/// Waits until the coordinator whose metrics are at `metrics` has `n`
/// transfers in flight.
fn wait_in_flight(metrics: &Value, n: usize) {
    let url = metrics["url"].as_str().unwrap();
    let want = format!("ferry_coordinator_in_flight{{node=\"coordinator\"}} {n}");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let text = ureq::get(url)
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        if text.lines().any(|l| l == want) {
            return;
        }
        assert!(Instant::now() < end, "never {want}: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This test's shared-memory objects left in /dev/shm.
fn shm_left(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect()
}

struct Scene {
    dir: std::path::PathBuf,
    prefix: String,
}

impl Scene {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-svc-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            dir,
            prefix: format!(
                "{}-t{}-{tag}",
                tensorferry_shm::prefix(),
                std::process::id()
            ),
        }
    }

    fn ep(&self, name: &str) -> String {
        format!("ipc://{}/{name}.sock", self.dir.display())
    }

    fn results(&self) -> Vec<String> {
        ["encoder", "denoiser", "decoder"]
            .iter()
            .map(|r| self.ep(&format!("c-{r}")))
            .collect()
    }

    fn coordinator(&self, extra: &[&str]) -> Daemon {
        let listen = self.results().join(",");
        let mut args = vec![
            "coordinator",
            "--listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        args.extend(extra);
        Daemon::start("coordinator", &self.prefix, &args)
    }

    fn instance(&self, role: &str, name: &str, plane: &[&str], extra: &[&str]) -> Daemon {
        let results = self.results();
        let coordinator = match role {
            "encoder" => &results[0],
            "denoiser" => &results[1],
            _ => &results[2],
        };
        let endpoint = self.ep(name);
        let mut args = vec![
            "instance",
            "--role",
            role,
            "--name",
            name,
            "--coordinator",
            coordinator,
            "--endpoint",
            &endpoint,
            "--metrics-listen",
            "127.0.0.1:0",
        ];
        args.extend(plane);
        args.extend(extra);
        Daemon::start(name, &self.prefix, &args)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        tensorferry_shm::clean_stale_with_prefix(&self.prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the coordinator printed `n` more deliveries.
fn deliveries(c: &mut Daemon, n: usize) {
    let end = Instant::now() + Duration::from_secs(120);
    let start = c.count("delivered");
    while c.count("delivered") < start + n {
        assert!(Instant::now() < end, "the pipeline stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn num(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// A whole pipeline of daemons on `plane`, stopped one by one with SIGTERM
/// while requests flow: a denoiser first (the other takes its work), then
/// the encoder, the other denoiser, the decoder and the coordinator.
fn stop_mid_run(tag: &str, plane: &[&str]) {
    let scene = Scene::new(tag);
    let mut c = scene.coordinator(&[]);
    wait_ready(&mut c, "ready");
    let hold = ["--hold-ms", "2", "--drain-timeout", "20"];
    let mut dec = scene.instance("decoder", "decoder", plane, &hold);
    let mut den0 = scene.instance("denoiser", "denoiser-0", plane, &hold);
    let mut den1 = scene.instance("denoiser", "denoiser-1", plane, &hold);
    for d in [&mut dec, &mut den0, &mut den1] {
        wait_ready(d, "registered");
    }
    let mut enc = scene.instance(
        "encoder",
        "encoder",
        plane,
        &[
            "--requests",
            "1000000",
            "--window",
            "6",
            "--pace-ms",
            "1",
            "--drain-timeout",
            "20",
        ],
    );
    wait_ready(&mut enc, "registered");
    deliveries(&mut c, 30);

    // A denoiser stopped mid-run: it finishes what it holds, takes no new
    // work, and the pipeline goes on through the other one.
    let s = den0.stop(30);
    assert_eq!(s["stop"]["drained"], true, "{s}");
    assert_eq!(num(&s, "mismatches"), 0, "{s}");
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    assert_eq!(num(&s, "forward_failed"), 0, "{s}");
    assert!(num(&s, "verified") > 0, "{s}");
    // The coordinator heard both steps.
    assert_eq!(c.wait_for("instance_draining", 10)["role"], 1);
    assert_eq!(c.wait_for("instance_left", 10)["role"], 1);
    deliveries(&mut c, 30);

    // The encoder: it stops staging, and every request it staged ends,
    // sent or failed with a reason.
    let s = enc.stop(30);
    assert!(num(&s, "staged") > 0, "{s}");
    assert_eq!(
        num(&s, "staged"),
        num(&s, "sent") + num(&s, "send_failed"),
        "{s}"
    );
    assert_eq!(num(&s, "requests_held"), 0, "{s}");

    for d in [&mut den1, &mut dec] {
        let s = d.stop(30);
        assert_eq!(num(&s, "mismatches"), 0, "{s}");
        assert_eq!(num(&s, "requests_held"), 0, "{s}");
        assert_eq!(s["stop"]["drained"], true, "{s}");
    }
    let s = c.stop(30);
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
    c.count("failed");
    let failed: Vec<&Value> = c.seen.iter().filter(|v| v["event"] == "failed").collect();
    assert_eq!(num(&s, "failed"), 0, "{s}\n{failed:?}");
    assert_eq!(s["stop"]["drained"], true, "{s}");
    assert_eq!(shm_left(&scene.prefix), Vec::<String>::new());
}

#[test]
fn a_pipeline_of_services_on_shm_stops_by_sigterm_mid_run() {
    stop_mid_run("svc-shm", &[]);
}

#[cfg(feature = "fabric")]
#[test]
fn a_pipeline_of_services_on_libfabric_tcp_stops_by_sigterm_mid_run() {
    stop_mid_run("svc-tcp", &common::FABRIC_TCP);
}

/// A stop that cannot drain: the encoder's requests wait for a receiver
/// that never comes. The first SIGTERM begins a long drain; the second
/// ends it at once, the pool still removed, and the coordinator fails
/// what the encoder had staged.
#[test]
fn a_second_signal_ends_a_drain_at_once() {
    let scene = Scene::new("svc-2nd");
    let mut c = scene.coordinator(&[]);
    let metrics = wait_ready(&mut c, "ready");
    let mut enc = scene.instance(
        "encoder",
        "encoder",
        &[],
        &["--requests", "3", "--drain-timeout", "600"],
    );
    wait_ready(&mut enc, "registered");
    // Staged, and queued at the coordinator for want of a denoiser.
    wait_in_flight(&metrics, 3);
    enc.signal("TERM");
    let draining = enc.wait_for("draining", 10);
    assert_eq!(num(&draining, "in_flight"), 3, "{draining}");
    let began = Instant::now();
    enc.signal("TERM");
    let s = enc.wait_for("summary", 10);
    assert_eq!(enc.exit_code(10), 0);
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(s["stop"]["drained"], false, "{s}");
    assert_eq!(num(&s["stop"], "failed_at_stop"), 3, "{s}");
    assert_eq!(num(&s, "send_failed"), 3, "{s}");
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    assert_eq!(shm_left(&scene.prefix), Vec::<String>::new());
    // The coordinator failed all three, the instance named as gone.
    for _ in 0..3 {
        let f = c.wait_for("failed", 10);
        assert_eq!(f["reason"], "instance left", "{f}");
    }
    let s = c.stop(10);
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
}

/// A coordinator stopped while a transfer is in flight fails it, and its
/// sender hears why.
#[test]
fn a_stopped_coordinator_fails_what_is_in_flight_and_tells_the_instances() {
    let scene = Scene::new("svc-coord");
    let mut c = scene.coordinator(&["--drain-timeout", "1"]);
    let metrics = wait_ready(&mut c, "ready");
    let mut enc = scene.instance("encoder", "encoder", &[], &["--requests", "2"]);
    enc.wait_for("registered", 30);
    // Both requests wait in the coordinator's queue (no denoiser).
    wait_in_flight(&metrics, 2);
    c.signal("TERM");
    let draining = c.wait_for("draining", 10);
    assert_eq!(num(&draining, "in_flight"), 2, "{draining}");
    // Nothing can drain (no denoiser): after the grace period, both fail.
    let s = c.wait_for("summary", 30);
    assert_eq!(c.exit_code(10), 0);
    assert_eq!(s["stop"]["drained"], false, "{s}");
    assert_eq!(num(&s, "failed"), 2, "{s}");
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
    let done = enc.wait_for("encoded", 10);
    assert_eq!(num(&done, "send_failed"), 2, "{done}");
    assert_eq!(done["failures"]["coordinator shutting down"], 2, "{done}");
    let s = enc.stop(10);
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    assert_eq!(shm_left(&scene.prefix), Vec::<String>::new());
}

/// Every option the deployment examples in `docs/deploy/` pass, and every
/// `FERRY_*` variable they set, is one the commands take.
#[test]
fn the_deployment_examples_pass_only_options_ferry_takes() {
    let help = |cmd: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let (coordinator, instance) = (help("coordinator"), help("instance"));
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploy");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        // Options on the command lines (comments may name other tools').
        let commands: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        for word in commands.split(|c: char| c.is_whitespace() || c == '"') {
            let Some(flag) = word.strip_prefix("--").filter(|f| !f.is_empty()) else {
                continue;
            };
            let name: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let flag = format!("--{}", name.trim_end_matches('-'));
            assert!(
                coordinator.contains(&flag) || instance.contains(&flag),
                "{}: {flag} is not an option of ferry coordinator or ferry instance",
                entry.path().display()
            );
            checked += 1;
        }
        for var in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if var.starts_with("FERRY_") && var != "FERRY_LOG" {
                assert!(
                    coordinator.contains(var) || instance.contains(var),
                    "{}: {var} is read by neither command",
                    entry.path().display()
                );
            }
        }
    }
    assert!(checked >= 10, "{checked} options checked");
}
