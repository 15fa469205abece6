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

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{num, Procs};

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

#[test]
fn a_python_coordinator_on_the_seed_drives_ferry_instances() {
    const N: u64 = 16;
    let mut p = Procs::new("a");
    let results = common::result_endpoints(&p, "py-coordinator");
    let coord = p.spawn(
        "py_coordinator",
        python("py_coordinator.py")
            .arg(N.to_string())
            .args(&results),
    );
    p.wait_for(coord, "\"event\": \"ready\"", 30);
    // Two receive slots at the denoiser (fast path while free), none at
    // the decoder (every request there takes the slow path).
    let mut c = common::instance(&p, "denoiser", &results[1], &["--prealloc", "2:16"]);
    let den = p.spawn("denoiser", &mut c);
    let mut c = common::instance(&p, "decoder", &results[2], &["--prealloc", "0:16"]);
    let dec = p.spawn("decoder", &mut c);
    p.wait_for(den, "\"event\":\"registered\"", 30);
    p.wait_for(dec, "\"event\":\"registered\"", 30);
    let mut c = common::instance(
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
    assert!(
        num(&summary, "fast") > 0 && num(&summary, "slow") > 0,
        "{summary}"
    );
    common::assert_clean(&p.finish(den), Some(N));
    common::assert_clean(&p.finish(dec), Some(N));
    let enc_summary = p.finish(enc);
    assert_eq!(num(&enc_summary, "sent"), N, "{enc_summary}");
    assert_eq!(num(&enc_summary, "requests_held"), 0, "{enc_summary}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(p.clean_shm(), (0, 0), "shared memory left behind");
}

#[test]
fn python_instances_on_the_seed_hand_off_through_a_ferry_coordinator() {
    const N: u64 = 12;
    let mut p = Procs::new("b");
    let results = common::result_endpoints(&p, "coordinator");
    let coord = common::coordinator(&mut p, &results);
    let mut c = common::instance(&p, "denoiser", &results[1], &["--prealloc", "2:16"]);
    let den = p.spawn("denoiser", &mut c);
    p.wait_for(den, "\"event\":\"registered\"", 30);
    let py = p.spawn(
        "py_instances",
        python("py_instances.py")
            .arg(N.to_string())
            .args([&results[0], &results[2]])
            .arg(&p.dir),
    );
    let summary = p.wait_for(py, "\"event\": \"summary\"", 150);
    // The Python decoder checked every byte the ferry denoiser wrote and
    // returned each result as sglang's tensor multipart, which ended the
    // request at the ferry coordinator.
    assert_eq!(num(&summary, "verified"), N, "{summary}");
    assert_eq!(num(&summary, "mismatches"), 0, "{summary}");
    assert_eq!(num(&summary, "alloc_dropped"), 0, "{summary}");
    assert_eq!(num(&summary, "outputs"), N, "{summary}");
    assert_eq!(num(&summary, "sent"), N, "{summary}");
    assert!(
        num(&summary, "fast") > 0 && num(&summary, "slow") > 0,
        "{summary}"
    );
    // The ferry denoiser checked every byte the Python encoder wrote.
    common::assert_clean(&p.finish(den), Some(N));
    let cs = p.finish(coord);
    assert_eq!(num(&cs, "delivered"), 2 * N, "{cs}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(p.clean_shm(), (0, 0), "shared memory left behind");
    assert_eq!(num(&cs, "failed"), 0, "{cs}");
    assert_eq!(num(&cs, "in_flight"), 0, "{cs}");
}
