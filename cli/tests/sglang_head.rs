//! ferry instances under sglang's released head (0.5.23's real
//! `DiffusionServer`, from the PyPI wheel, unmodified): an encoder, two
//! denoisers and a decoder as `ferry instance --workload sglang`
//! processes, a client on the head's frontend, every byte checked at each
//! role and every client reply checked against the decoder's output
//! (`cli/tests/sglang/head_run.py` drives it).
//!
//! The environment (sglang with the head's import chain: torch,
//! transformers, diffusers and their pins) is installed once by
//! `scripts/sglang-env` under `~/.cache/ferry/`; `scripts/test` runs it.
//! Without it these tests fail and say how to install it: they never skip.

use std::path::PathBuf;
use std::process::Command;

/// The Python of the cached sglang environment.
fn python() -> PathBuf {
    let path = std::env::var_os("FERRY_SGLANG_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home =
                std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
            home.join(".cache/ferry/sglang-0.5.23/bin/python")
        });
    assert!(
        path.exists(),
        "{} is missing: install sglang 0.5.23's head with `scripts/sglang-env` (scripts/test does), \
         or point FERRY_SGLANG_PYTHON at a Python that has it",
        path.display()
    );
    path
}

/// Runs the harness with `args`; returns its JSON result.
fn run(tag: &str, args: &[&str]) -> (serde_json::Value, String) {
    let prefix = format!(
        "{}-sg{}-{tag}",
        tensorferry_shm::prefix(),
        std::process::id()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sglang/head_run.py");
    let out = Command::new(python())
        .arg(script)
        .arg("--ferry")
        .arg(env!("CARGO_BIN_EXE_ferry"))
        .args(args)
        .env("FERRY_SHM_PREFIX", &prefix)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .expect("start the sglang harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or("");
    let result: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "no result from the harness ({e}); status {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        )
    });
    assert!(
        out.status.success(),
        "the harness failed: {}\nstderr:\n{stderr}",
        result["failures"]
    );
    (result, prefix)
}

#[test]
fn thirty_two_requests_complete_through_sglangs_head_with_every_byte_checked() {
    let (r, prefix) = run("ok", &["--requests", "32", "--head-timeout", "60"]);
    assert_eq!(r["outputs"], 32, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    let s = &r["summaries"];
    assert_eq!(s["encoder-0"]["work_items"], 32, "{r}");
    assert_eq!(s["decoder-0"]["verified"], 32, "{r}");
    assert_eq!(s["decoder-0"]["outputs"], 32, "{r}");
    let forwarded = s["denoiser-0"]["forwarded"].as_u64().unwrap_or(0)
        + s["denoiser-1"]["forwarded"].as_u64().unwrap_or(0);
    assert_eq!(forwarded, 32, "{r}");
    // Both denoisers served, and the head registered each instance once.
    assert!(s["denoiser-0"]["verified"].as_u64() > Some(0), "{r}");
    assert!(s["denoiser-1"]["verified"].as_u64() > Some(0), "{r}");
    assert_eq!(r["head"]["denoiser_peers"], 2, "{r}");
    // Every process unlinked its pool.
    assert_eq!(
        tensorferry_shm::clean_stale_with_prefix(&prefix),
        Vec::<String>::new()
    );
}

#[test]
fn a_denoiser_killed_mid_run_fails_only_its_requests_and_the_rest_leak_nothing() {
    let (r, prefix) = run(
        "kill",
        &[
            "--requests",
            "32",
            "--head-timeout",
            "8",
            "--kill-denoiser-after",
            "8",
        ],
    );
    assert_eq!(r["killed"], "denoiser-1", "{r}");
    let (ok, failed) = (
        r["outputs"].as_u64().unwrap_or(0),
        r["failed"].as_u64().unwrap_or(0),
    );
    assert_eq!(ok + failed, 32, "{r}");
    assert!(failed > 0 && ok > 8, "{r}");
    // The survivors hold nothing (the harness checked their summaries);
    // only the killed process's pool is left, and it is removed here.
    let left = tensorferry_shm::clean_stale_with_prefix(&prefix);
    assert_eq!(left.len(), 1, "{left:?}");
}
