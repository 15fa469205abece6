//! Helpers of the multi-process tests: processes whose stdout lines (one
//! JSON object each) are merged and waited for.
#![allow(dead_code)]

pub mod flood;
pub mod keys;
pub mod scenarios;

// The runtime tests' helper, shared rather than copied.
#[path = "../../../tests/common/mod.rs"]
mod runtime_common;
#[allow(unused_imports)]
pub use runtime_common::endpoint;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One process.
pub struct Proc {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Processes of one test, their stdout lines merged, killed on drop.
pub struct Procs {
    procs: Vec<Proc>,
    tx: mpsc::Sender<(usize, String)>,
    rx: mpsc::Receiver<(usize, String)>,
    /// Lines read while waiting for another process's.
    backlog: Vec<(usize, String)>,
    pub dir: PathBuf,
    /// The shared-memory object prefix of this test's processes.
    pub shm_prefix: String,
}

impl Procs {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-mp-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (tx, rx) = mpsc::channel();
        Self {
            procs: Vec::new(),
            tx,
            rx,
            backlog: Vec::new(),
            dir,
            shm_prefix: format!(
                "{}-t{}-{tag}",
                tensorferry_shm::prefix(),
                std::process::id()
            ),
        }
    }

    pub fn ep(&self, name: &str) -> String {
        format!("ipc://{}/{name}.sock", self.dir.display())
    }

    pub fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> usize {
        let i = self.procs.len();
        let tx = self.tx.clone();
        cmd.env("FERRY_SHM_PREFIX", &self.shm_prefix)
            // `finish` ends a process by closing its stdin.
            .env("FERRY_EXIT_ON_STDIN_CLOSE", "true")
            .stdin(Stdio::piped());
        let mut child = spawn_reading(cmd, name, move |line| {
            let _ = tx.send((i, line));
        });
        let stdin = child.stdin.take();
        self.procs.push(Proc { name, child, stdin });
        i
    }

    /// The first line of process `i` holding `tag`, within `secs`.
    pub fn wait_for(&mut self, i: usize, tag: &str, secs: u64) -> String {
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

    /// The process id of process `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.procs[i].child.id()
    }

    /// Closes the stdin of process `i` (it finishes) and returns its
    /// summary line, once the process has exited (so that what it removes
    /// on its way out, its pools among them, is gone).
    pub fn finish(&mut self, i: usize) -> String {
        drop(self.procs[i].stdin.take());
        let summary = self.wait_for(i, "\"event\":\"summary\"", 30);
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            match self.procs[i].child.try_wait() {
                Ok(Some(_)) => return summary,
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
                Ok(None) => panic!(
                    "{} did not exit within 30 s of its summary",
                    self.procs[i].name
                ),
                Err(e) => panic!("waiting for {}: {e}", self.procs[i].name),
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        // What killed processes left in shared memory.
        tensorferry_shm::clean_stale_with_prefix(&self.shm_prefix);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\":");
    let start = json
        .find(&tag)
        .map(|i| i + tag.len())
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = json[start..].trim_start();
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().trim_matches('"')
}

pub fn num(json: &str, key: &str) -> u64 {
    field(json, key)
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {json}"))
}

/// Starts `cmd` (its stderr shows in the test's) and sends each line it
/// prints to stdout to `send`, from a thread of its own. `what` names it
/// if it cannot be started.
pub fn spawn_reading(
    cmd: &mut Command,
    what: &str,
    send: impl Fn(String) + Send + 'static,
) -> Child {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            send(line);
        }
    });
    child
}

/// The `ferry` binary.
pub fn ferry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferry"))
}

/// `ferry instance` of `role` over ZeroMQ, named `role`, at its endpoint in
/// the test's directory.
pub fn instance(p: &Procs, role: &str, coordinator: &str, extra: &[&str]) -> Command {
    named_instance(p, role, role, coordinator, extra)
}

/// `ferry instance` of `role` over ZeroMQ, named `name`.
pub fn named_instance(
    p: &Procs,
    role: &str,
    name: &str,
    coordinator: &str,
    extra: &[&str],
) -> Command {
    let mut c = instance_at(role, name, coordinator, &p.ep(name));
    c.args(extra);
    c
}

/// Starts the encoder (`ferry instance` of `encoder` over ZeroMQ, named
/// `encoder`) registering with `coordinator`, with `args` and then `more`:
/// its index.
pub fn spawn_encoder(p: &mut Procs, coordinator: &str, args: &[&str], more: &[&str]) -> usize {
    let mut cmd = named_instance(p, "encoder", "encoder", coordinator, args);
    cmd.args(more);
    p.spawn("encoder", &mut cmd)
}

/// `ferry instance` of `role` over ZeroMQ, named `name`, at `endpoint`.
pub fn instance_at(role: &str, name: &str, coordinator: &str, endpoint: &str) -> Command {
    let mut c = ferry();
    c.args([
        "instance",
        "--control",
        "zmq",
        "--role",
        role,
        "--name",
        name,
    ])
    .args(["--coordinator", coordinator, "--endpoint", endpoint]);
    c
}

/// The random workload with small requests (seed 3, at most 64 KiB), as
/// the tests of hostile peers run it.
pub const SMALL_RANDOM: [&str; 6] = [
    "--workload",
    "random",
    "--seed",
    "3",
    "--max-bytes",
    "65536",
];

/// The libfabric plane over `tcp;ofi_rxm`, bound to loopback.
pub const FABRIC_TCP: [&str; 6] = [
    "--backend",
    "fabric",
    "--provider",
    "tcp;ofi_rxm",
    "--fabric-source",
    "127.0.0.1",
];

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `tcp://127.0.0.1:port`.
pub fn tcp(port: u16) -> String {
    format!("tcp://127.0.0.1:{port}")
}

/// Checks an instance's summary: every byte it got was right (and, if
/// given, how many it checked), and it holds nothing any more.
pub fn assert_clean(summary: &str, verified: Option<u64>) {
    assert_eq!(num(summary, "mismatches"), 0, "{summary}");
    if let Some(v) = verified {
        assert_eq!(num(summary, "verified"), v, "{summary}");
    }
    assert_eq!(num(summary, "requests_held"), 0, "{summary}");
    assert_eq!(
        num(summary, "live_slots"),
        num(summary, "prealloc_slots"),
        "{summary}"
    );
}

impl Procs {
    /// Removes the shared-memory objects of this test's dead processes;
    /// returns how many, and how many of its objects remain.
    pub fn clean_shm(&self) -> (usize, usize) {
        let cleaned = tensorferry_shm::clean_stale_with_prefix(&self.shm_prefix).len();
        let left = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.starts_with(&format!("{}-", self.shm_prefix)))
                    })
                    .count()
            })
            .unwrap_or(0);
        (cleaned, left)
    }

    /// Kills process `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        let _ = self.procs[i].child.kill();
        let _ = self.procs[i].child.wait();
    }
}

/// The coordinator's result endpoint of each role, in pipeline order, in
/// the test's directory, named `<name>-<role>`.
pub fn result_endpoints(p: &Procs, name: &str) -> Vec<String> {
    ["encoder", "denoiser", "decoder"]
        .iter()
        .map(|r| p.ep(&format!("{name}-{r}")))
        .collect()
}

/// `ferry coordinator` over ZeroMQ at `results`, started and ready.
pub fn coordinator(p: &mut Procs, results: &[String]) -> usize {
    coordinator_with(p, results, &[])
}

/// `ferry coordinator` over ZeroMQ at `results` with `extra` arguments,
/// started and ready.
pub fn coordinator_with(p: &mut Procs, results: &[String], extra: &[&str]) -> usize {
    let c = p.spawn(
        "coordinator",
        ferry()
            .args([
                "coordinator",
                "--control",
                "zmq",
                "--listen",
                &results.join(","),
            ])
            .args(extra),
    );
    p.wait_for(c, "\"event\":\"ready\"", 30);
    c
}
