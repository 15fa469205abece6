//! Interoperability with the seed's own Python (`../shared/seed/protocol.py`,
//! unmodified) over ZeroMQ, with pyzmq (installed by `scripts/test`):
//!
//! * a Python coordinator built on the seed's message classes drives ferry
//!   instances (encoder → denoiser → decoder) through registration and
//!   hand-offs on both the preallocated-slot fast path and the slow path;
//! * Python instances written with the seed's classes (an encoder whose data
//!   plane writes into a ferry denoiser's shared-memory pool, and a decoder
//!   with a pool of its own) hand off through a ferry coordinator.
//!
//! Every byte is checked where it arrives, on both sides.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Proc {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Processes of one test, their stdout lines merged, killed on drop.
struct Procs {
    procs: Vec<Proc>,
    tx: mpsc::Sender<(usize, String)>,
    rx: mpsc::Receiver<(usize, String)>,
    /// Lines read while waiting for another process's.
    backlog: Vec<(usize, String)>,
    dir: PathBuf,
}

impl Procs {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-interop-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tx, rx) = mpsc::channel();
        Self {
            procs: Vec::new(),
            tx,
            rx,
            backlog: Vec::new(),
            dir,
        }
    }

    fn ep(&self, name: &str) -> String {
        format!("ipc://{}/{name}.sock", self.dir.display())
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> usize {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let i = self.procs.len();
        let out = child.stdout.take().unwrap();
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((i, line));
            }
        });
        let stdin = child.stdin.take();
        self.procs.push(Proc { name, child, stdin });
        i
    }

    /// The first line of process `i` holding `tag`, within `secs`.
    fn wait_for(&mut self, i: usize, tag: &str, secs: u64) -> String {
        if let Some(k) = self
            .backlog
            .iter()
            .position(|(j, line)| *j == i && line.contains(tag))
        {
            return self.backlog.remove(k).1;
        }
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((j, line)) if j == i && line.contains(tag) => return line,
                Ok((j, line)) if line.contains("\"event\":\"error\"") => {
                    panic!("{}: {line}", self.procs[j].name)
                }
                Ok(other) => self.backlog.push(other),
                Err(_) => panic!("{} did not print {tag}", self.procs[i].name),
            }
        }
    }

    /// Closes the stdin of process `i` (it finishes) and returns its
    /// summary line.
    fn finish(&mut self, i: usize) -> String {
        drop(self.procs[i].stdin.take());
        self.wait_for(i, "\"event\":\"summary\"", 30)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\":");
    let start = json
        .find(&tag)
        .map(|i| i + tag.len())
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = json[start..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().trim_matches('"')
}

fn num(json: &str, key: &str) -> u64 {
    field(json, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {json}"))
}

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop")
}

fn python(script: &str) -> Command {
    let check = Command::new("python3")
        .args(["-c", "import zmq, numpy"])
        .status()
        .expect("python3 runs");
    assert!(
        check.success(),
        "the interop tests need python3 with pyzmq and numpy (scripts/test installs them)"
    );
    let mut c = Command::new("python3");
    c.arg(interop_dir().join(script)).current_dir(interop_dir());
    c
}

fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

fn instance(p: &Procs, role: &str, coordinator: &str, extra: &[&str]) -> Command {
    let mut c = ferry();
    c.args(["instance", "--control", "zmq", "--role", role, "--name", role])
        .args(["--coordinator", coordinator, "--endpoint", &p.ep(role)])
        .args(extra);
    c
}

/// Checks an instance's summary: every byte it got was right, and it holds
/// nothing any more.
fn assert_clean(summary: &str, verified: u64) {
    assert_eq!(num(summary, "mismatches"), 0, "{summary}");
    assert_eq!(num(summary, "verified"), verified, "{summary}");
    assert_eq!(num(summary, "requests_held"), 0, "{summary}");
    assert_eq!(
        num(summary, "live_slots"),
        num(summary, "prealloc_slots"),
        "{summary}"
    );
}

#[test]
fn a_python_coordinator_on_the_seed_drives_ferry_instances() {
    const N: u64 = 16;
    let mut p = Procs::new("a");
    let results: Vec<String> = ["encoder", "denoiser", "decoder"]
        .iter()
        .map(|r| p.ep(&format!("py-coordinator-{r}")))
        .collect();
    let coord = p.spawn(
        "py_coordinator",
        python("py_coordinator.py")
            .arg(N.to_string())
            .args(&results),
    );
    p.wait_for(coord, "\"event\": \"ready\"", 30);
    // Two receive slots at the denoiser (fast path while free), none at
    // the decoder (every request there takes the slow path).
    let mut c = instance(&p, "denoiser", &results[1], &["--prealloc", "2:16"]);
    let den = p.spawn("denoiser", &mut c);
    let mut c = instance(&p, "decoder", &results[2], &["--prealloc", "0:16"]);
    let dec = p.spawn("decoder", &mut c);
    p.wait_for(den, "\"event\":\"registered\"", 30);
    p.wait_for(dec, "\"event\":\"registered\"", 30);
    let mut c = instance(
        &p,
        "encoder",
        &results[0],
        &["--requests", &N.to_string(), "--window", "4"],
    );
    let enc = p.spawn("encoder", &mut c);
    let summary = p.wait_for(coord, "\"event\": \"summary\"", 120);
    // Every message ferry sent was read by the seed's decode_transfer_msg.
    assert_eq!(num(&summary, "bad"), 0, "{summary}");
    assert_eq!(num(&summary, "delivered"), N, "{summary}");
    assert_eq!(num(&summary, "failed"), 0, "{summary}");
    assert_eq!(num(&summary, "in_flight"), 0, "{summary}");
    assert!(num(&summary, "fast") > 0 && num(&summary, "slow") > 0, "{summary}");
    assert_clean(&p.finish(den), N);
    assert_clean(&p.finish(dec), N);
    let enc_summary = p.finish(enc);
    assert_eq!(num(&enc_summary, "sent"), N, "{enc_summary}");
    assert_eq!(num(&enc_summary, "requests_held"), 0, "{enc_summary}");
}

#[test]
fn python_instances_on_the_seed_hand_off_through_a_ferry_coordinator() {
    const N: u64 = 12;
    let mut p = Procs::new("b");
    let results: Vec<String> = ["encoder", "denoiser", "decoder"]
        .iter()
        .map(|r| p.ep(&format!("coordinator-{r}")))
        .collect();
    let coord = p.spawn(
        "coordinator",
        ferry().args(["coordinator", "--control", "zmq", "--listen", &results.join(",")]),
    );
    p.wait_for(coord, "\"event\":\"ready\"", 30);
    let mut c = instance(&p, "denoiser", &results[1], &["--prealloc", "2:16"]);
    let den = p.spawn("denoiser", &mut c);
    p.wait_for(den, "\"event\":\"registered\"", 30);
    let py = p.spawn(
        "py_instances",
        python("py_instances.py")
            .arg(N.to_string())
            .args([&results[0], &results[2]])
            .arg(&p.dir),
    );
    let summary = p.wait_for(py, "\"event\": \"summary\"", 120);
    // The Python decoder checked every byte the ferry denoiser wrote.
    assert_eq!(num(&summary, "verified"), N, "{summary}");
    assert_eq!(num(&summary, "mismatches"), 0, "{summary}");
    assert_eq!(num(&summary, "sent"), N, "{summary}");
    assert!(num(&summary, "fast") > 0 && num(&summary, "slow") > 0, "{summary}");
    // The ferry denoiser checked every byte the Python encoder wrote.
    assert_clean(&p.finish(den), N);
    let cs = p.finish(coord);
    assert_eq!(num(&cs, "delivered"), 2 * N, "{cs}");
    assert_eq!(num(&cs, "failed"), 0, "{cs}");
    assert_eq!(num(&cs, "in_flight"), 0, "{cs}");
}
