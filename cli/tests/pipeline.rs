//! The pipeline as separate OS processes: the `ferry pipeline` launcher
//! starts a coordinator, an encoder, denoisers and a decoder, each its own
//! process, over Unix sockets and shared-memory pools.

use std::process::Command;

/// Runs `ferry pipeline <args> --json`; returns its summary line and the
/// launcher's pid (which names its shared-memory objects).
fn pipeline(args: &[&str]) -> (bool, String, u32) {
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("pipeline")
        .args(args)
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("ferry runs");
    let pid = child.id();
    let out = child.wait_with_output().expect("ferry finishes");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().last().unwrap_or("").to_owned();
    (out.status.success(), line, pid)
}

fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let tag = format!("\"{key}\":");
    let start = json.find(&tag).map(|i| i + tag.len()).unwrap_or_else(|| {
        panic!("no {key} in {json}");
    });
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim_matches('"')
}

fn num(json: &str, key: &str) -> u64 {
    field(json, key).parse().unwrap()
}

/// Shared-memory objects the run at `pid` left behind.
fn leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("{}-pl{pid}-", tensorferry_shm::prefix());
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Checks a pipeline run (`pipeline`'s answer): it succeeded, each of
/// its `n` requests was delivered with every byte right, and it left
/// nothing in /dev/shm. Returns its report.
fn all_delivered((ok, line, pid): (bool, String, u32), n: u64) -> String {
    assert!(ok, "{line}");
    assert_eq!(field(&line, "ok"), "true", "{line}");
    assert_eq!(
        (num(&line, "delivered"), num(&line, "failed")),
        (n, 0),
        "{line}"
    );
    assert_eq!(num(&line, "mismatches"), 0);
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
    line
}

#[test]
fn every_request_arrives_and_every_byte_is_checked() {
    let line = all_delivered(pipeline(&["--requests", "24"]), 24);
    assert_eq!(num(&line, "leaks"), 0);
}

#[test]
fn every_request_arrives_over_cross_memory_attach() {
    // The `local` plane serves nodes too: each pool is its process's own
    // memory, written by its peers with process_vm_writev.
    let line = all_delivered(pipeline(&["--requests", "16", "--backend", "local"]), 16);
    assert_eq!(field(&line, "data_plane"), "cross-memory attach", "{line}");
}

#[test]
fn a_denoiser_killed_mid_run_fails_only_its_requests() {
    // A push timeout of 2 s bounds how long an interrupted write may hang.
    let (ok, line, pid) = pipeline(&[
        "--requests",
        "48",
        "--kill",
        "1@8",
        "--push-timeout-ms",
        "2000",
        "--timeout-secs",
        "60",
    ]);
    assert!(ok, "{line}");
    assert_eq!(field(&line, "killed"), "denoiser-1", "{line}");
    assert_eq!(field(&line, "incomplete"), "false", "{line}");
    let (delivered, failed) = (num(&line, "delivered"), num(&line, "failed"));
    assert_eq!(delivered + failed, 48, "{line}");
    // Whatever was not at the killed denoiser went through the survivor.
    assert!(delivered >= 24, "{line}");
    // Only the kill failed requests, and the survivors hold no slot.
    assert_eq!(
        line.matches("\"reason\":").count(),
        line.matches("\"reason\":\"instance went away\"").count(),
        "{line}"
    );
    assert_eq!(num(&line, "mismatches"), 0);
    assert_eq!(num(&line, "leaks"), 0, "{line}");
    // The killed process's pool was removed; nothing else was left.
    assert_eq!(num(&line, "shm_cleaned"), 1, "{line}");
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
}

#[test]
fn bad_arguments_are_refused() {
    let (ok, _, _) = pipeline(&["--denoisers", "1", "--kill", "3@1"]);
    assert!(!ok);
}
