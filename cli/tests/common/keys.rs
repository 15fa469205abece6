//! CURVE keys of a test's processes, made by `ferry keygen`, and the
//! arguments that hand them to `ferry coordinator` and `ferry instance`.

use std::path::{Path, PathBuf};

use super::ferry;

/// `ferry keygen NAME --dir DIR`: its report.
pub fn keygen(dir: &Path, name: &str) -> serde_json::Value {
    let out = ferry()
        .args(["keygen", name, "--dir"])
        .arg(dir)
        .output()
        .expect("ferry runs");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Keys in `dir` for a coordinator (`<dir>/coordinator/`) and the
/// instances named (`<dir>/instances/`).
pub fn keys(dir: PathBuf, instances: &[&str]) -> PathBuf {
    keygen(&dir.join("coordinator"), "coordinator");
    for name in instances {
        keygen(&dir.join("instances"), name);
    }
    dir
}

/// The `--curve-key`/`--curve-peers` arguments of `name`, of the keys in
/// `keys` (the coordinator admits the instances, each instance its
/// coordinator).
pub fn curve(keys: &Path, name: &str) -> Vec<String> {
    let (key, peers) = if name == "coordinator" {
        (
            keys.join("coordinator/coordinator.key_secret"),
            keys.join("instances"),
        )
    } else {
        (
            keys.join(format!("instances/{name}.key_secret")),
            keys.join("coordinator/coordinator.key"),
        )
    };
    vec![
        "--curve-key".into(),
        key.display().to_string(),
        "--curve-peers".into(),
        peers.display().to_string(),
    ]
}
