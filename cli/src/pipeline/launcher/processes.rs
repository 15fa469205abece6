//! The processes a run starts and owns: each spawned with its role's
//! arguments (its CURVE keys among them), its report lines read on a
//! thread of its own, and at the end stopped and collected, with the
//! run's directory and what killed processes left in shared memory
//! removed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tensorferry_core::json::RawJson;

use super::{get, metrics_address, plane_flag, LaunchArgs};
use crate::pipeline::Control;

pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) alive: bool,
}

/// Where the pipeline's processes report.
type Lines = mpsc::Receiver<(usize, String)>;

pub(super) struct Run {
    pub(super) args: LaunchArgs,
    pub(super) procs: Vec<Proc>,
    pub(super) tx: mpsc::Sender<(usize, String)>,
    pub(super) rx: Lines,
    pub(super) dir: PathBuf,
    pub(super) prefix: String,
}

/// Where the run's CURVE certificates are: the coordinator's in one
/// directory, the instances' in another (which the coordinator admits).
pub(super) fn coordinator_keys(dir: &Path) -> PathBuf {
    dir.join("keys").join("coordinator")
}

pub(super) fn instance_keys(dir: &Path) -> PathBuf {
    dir.join("keys").join("instances")
}

/// Makes a key pair for the coordinator and for each of `instances`.
pub(super) fn make_keys(dir: &Path, instances: &[String]) -> Result<(), String> {
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
    pub(super) fn spawn(&mut self, name: &str, role_args: &[String]) -> Result<usize, String> {
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

    pub(super) fn endpoint(&self, name: &str) -> String {
        format!("ipc://{}/{name}.sock", self.dir.display())
    }

    /// Waits for `event` from each of `procs`; returns the line each of
    /// them reported it in, in the order they came.
    pub(super) fn expect(
        &self,
        procs: &[usize],
        event: &str,
        within: Duration,
    ) -> Result<Vec<(usize, String)>, String> {
        let end = Instant::now() + within;
        let mut waiting: Vec<usize> = procs.to_vec();
        let mut lines = Vec::with_capacity(procs.len());
        let tag = format!(r#""event":"{event}""#);
        while !waiting.is_empty() {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((j, line)) if line.contains(&tag) && waiting.contains(&j) => {
                    waiting.retain(|&w| w != j);
                    lines.push((j, line));
                }
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
        Ok(lines)
    }

    /// Says where process `j` serves its metrics (its `metrics` line).
    pub(super) fn metrics_at(&self, j: usize, line: &str) {
        if let Some(url) = RawJson::parse_object(line).ok().and_then(|o| get(o, "url")) {
            eprintln!(
                "pipeline: {} serves its metrics at {url}",
                self.procs[j].name
            );
        }
    }

    /// Where instances of `role` report to the coordinator.
    pub(super) fn result_endpoint(&self, role: &str) -> String {
        match self.args.control {
            Control::Uds => self.endpoint("coordinator"),
            Control::Zmq => self.endpoint(&format!("coordinator-{role}")),
        }
    }

    pub(super) fn control_arg(&self) -> &'static str {
        match self.args.control {
            Control::Uds => "uds",
            Control::Zmq => "zmq",
        }
    }

    pub(super) fn instance(&mut self, role: &str, name: &str) -> Result<usize, String> {
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
            let backend = plane_flag(&self.args.data_plane, "--backend").unwrap_or_default();
            let plane = tensorferry::plane::DataPlane::resolve(backend);
            let admits_writers = tensorferry::plane::DataPlane::options_of(plane)
                .is_some_and(|takes| takes.contains(&"writers"));
            if admits_writers {
                // Every instance may write into every other one, on a
                // data plane that admits writers by key.
                a.extend([
                    "--plane-option".to_owned(),
                    format!("writers={}", instance_keys(&self.dir).display()),
                ]);
            }
        }
        self.spawn(name, &a)
    }

    pub(super) fn stop_all(&mut self) -> Vec<(String, String)> {
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
pub(super) fn shm_objects(prefix: &str) -> usize {
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

/// A new directory under the temporary directory, named `prefix` and a
/// random suffix, that only this user may enter (as `mkdtemp` makes one):
/// never one that was there before, which another local user could have
/// made and filled (the pipeline's keys and sockets go in it).
pub(super) fn fresh_dir(prefix: &str) -> Result<std::path::PathBuf, String> {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..16 {
        // std's hasher keys are drawn from the system's random source.
        let suffix = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let dir = std::env::temp_dir().join(format!("{prefix}-{suffix:016x}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!(
        "no new directory {prefix}-* could be made in {}: {}",
        std::env::temp_dir().display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}
