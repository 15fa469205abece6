//! CurveZMQ between real `ferry coordinator` and `ferry instance`
//! processes: keys from `ferry keygen` and from pyzmq, a flood of forged
//! messages from an allowed address by senders without an admitted key,
//! the pipeline over CURVE, and the combinations that are refused.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use common::flood::{flood_of_known_ids_changes_nothing, forger};
use common::keys::{curve, keygen, keys};
use common::{coordinator_with, ferry, free_port, instance_at, Procs, SMALL_RANDOM};
use serde_json::Value;
use tensorferry_zmq::zmq;

/// A free TCP endpoint on 127.0.0.1.
fn tcp() -> String {
    common::tcp(free_port())
}

/// `ferry instance` over ZeroMQ with the random workload, at `endpoint`.
fn instance(role: &str, coordinator: &str, endpoint: &str, extra: &[String]) -> Command {
    let mut c = instance_at(role, role, coordinator, endpoint);
    c.args(SMALL_RANDOM).args(extra);
    c
}

/// A PUSH socket to `to` as a CURVE client with a key nobody admitted
/// (knowing the server's public key `server`, from its certificate).
fn unlisted(ctx: &zmq::Context, to: &str, server: &Path) -> zmq::Socket {
    let mine = zmq::CurveKeyPair::new().unwrap();
    let server = tensorferry_zmq::read_public_key(server).unwrap();
    let s = ctx.socket(zmq::PUSH).unwrap();
    s.set_sndhwm(100_000).unwrap();
    s.set_linger(0).unwrap();
    s.set_curve_serverkey(&server.0).unwrap();
    s.set_curve_publickey(&mine.public_key).unwrap();
    s.set_curve_secretkey(&mine.secret_key).unwrap();
    s.connect(to).unwrap();
    s
}

/// `a_flood_of_forged_messages_from_outside_the_allow_list_changes_nothing`
/// (hostile.rs) again, from 127.0.0.1, an address the allow-list admits:
/// under CURVE, senders without a key and with a key nobody admitted are
/// refused before a message of theirs is read.
#[test]
fn a_flood_from_an_allowed_address_without_an_admitted_key_changes_nothing() {
    let mut p = Procs::new("curve-flood");
    let keys = keys(p.dir.join("keys"), &["encoder", "denoiser"]);
    let results: Vec<String> = (0..3).map(|_| tcp()).collect();
    let allow = ["--allow-from".to_owned(), "127.0.0.1".to_owned()];
    let mut extra = allow.to_vec();
    extra.extend(curve(&keys, "coordinator"));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let c = coordinator_with(&mut p, &results, &extra);
    let den_ep = tcp();
    let mut den_args = allow.to_vec();
    den_args.extend(curve(&keys, "denoiser"));
    let d = p.spawn(
        "denoiser",
        &mut instance("denoiser", &results[1], &den_ep, &den_args),
    );
    let registered = p.wait_for(d, "\"event\":\"registered\"", 30);
    let enc_ep = tcp();
    let mut enc_args = allow.to_vec();
    enc_args.extend(curve(&keys, "encoder"));
    enc_args.extend(["--requests", "200", "--window", "2", "--pace-ms", "5"].map(str::to_owned));
    let e = p.spawn(
        "encoder",
        &mut instance("encoder", &results[0], &enc_ep, &enc_args),
    );

    // From 127.0.0.1, at the denoiser's work endpoint, the encoder's, and
    // every result endpoint of the coordinator: plain ZeroMQ (no key), and
    // CURVE with a key nobody admitted.
    let ctx = zmq::Context::new();
    let mut targets: Vec<zmq::Socket> = Vec::new();
    for (to, server) in [
        (&den_ep, keys.join("instances/denoiser.key")),
        (&enc_ep, keys.join("instances/encoder.key")),
    ]
    .into_iter()
    .chain(
        results
            .iter()
            .map(|r| (r, keys.join("coordinator/coordinator.key"))),
    ) {
        targets.push(forger(&ctx, to));
        targets.push(unlisted(&ctx, to, &server));
    }
    flood_of_known_ids_changes_nothing(&mut p, targets, &registered, (d, e, c));
}

/// Keys made by pyzmq (`zmq.auth.create_certificates`) serve `ferry
/// coordinator`, keys made by `ferry keygen` serve `ferry instance`, and
/// pyzmq reads what `ferry keygen` wrote.
#[test]
fn keys_from_pyzmq_and_from_ferry_keygen_work_in_both() {
    let mut p = Procs::new("curve-keys");
    let dir = p.dir.join("keys");
    std::fs::create_dir_all(dir.join("coordinator")).unwrap();
    let made = Command::new("python3")
        .args([
            "-c",
            "import sys, zmq.auth; zmq.auth.create_certificates(sys.argv[1], 'coordinator')",
        ])
        .arg(dir.join("coordinator"))
        .status()
        .expect("python3 runs");
    assert!(
        made.success(),
        "this test needs python3 with pyzmq (scripts/test installs it)"
    );
    // pyzmq writes the secret certificate with the process's umask; ferry
    // takes a secret only its owner may read, as the book tells users.
    let secret = dir.join("coordinator").join("coordinator.key_secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let report = keygen(&dir.join("instances"), "denoiser");
    let read = Command::new("python3")
        .args([
            "-c",
            "import sys, zmq.auth; p, s = zmq.auth.load_certificate(sys.argv[1]); print(p.decode(), s is not None)",
        ])
        .arg(report["secret"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(read.status.success(), "{read:?}");
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        format!("{} True", report["public_key"].as_str().unwrap())
    );
    let results: Vec<String> = (0..3).map(|_| tcp()).collect();
    let extra = curve(&dir, "coordinator");
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let c = coordinator_with(&mut p, &results, &extra);
    let d = p.spawn(
        "denoiser",
        &mut instance("denoiser", &results[1], &tcp(), &curve(&dir, "denoiser")),
    );
    p.wait_for(d, "\"event\":\"registered\"", 30);
    p.wait_for(c, "\"event\":\"registered\"", 30);
}

#[test]
fn curve_is_refused_where_it_cannot_apply() {
    let p = Procs::new("curve-refused");
    let keys = keys(p.dir.join("keys"), &["decoder", "encoder"]);
    let run = |extra: &[String]| {
        let out = instance("decoder", "tcp://127.0.0.1:1", "tcp://127.0.0.1:0", extra)
            .output()
            .expect("ferry runs");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mine = curve(&keys, "decoder");
    // Under sglang's head, which speaks plain ZeroMQ.
    let mut a = mine.clone();
    a.extend(["--head".into(), "sglang".into()]);
    assert!(run(&a).contains("sglang's head"));
    // An instance admits one key: its coordinator's.
    let mut a = mine[..2].to_vec();
    a.extend([
        "--curve-peers".into(),
        keys.join("instances").display().to_string(),
    ]);
    assert!(run(&a).contains("one CURVE key"));
    // Not without ZeroMQ.
    let out = ferry()
        .args(["instance", "--control", "uds", "--role", "decoder"])
        .args([
            "--coordinator",
            "ipc:///nowhere",
            "--endpoint",
            "ipc:///nowhere-too",
        ])
        .args(&mine)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--control zmq"));
    // A key without peers, a public certificate for a secret one.
    let out = instance(
        "decoder",
        "tcp://127.0.0.1:1",
        "tcp://127.0.0.1:0",
        &mine[..2],
    )
    .output()
    .unwrap();
    assert!(!out.status.success());
    let mut a = mine.clone();
    a[1] = keys.join("instances/decoder.key").display().to_string();
    let e = run(&a);
    assert!(e.contains("decoder.key: no `secret-key`"), "{e}");
}

#[test]
fn the_pipeline_runs_over_curve() {
    let out = ferry()
        .args([
            "pipeline",
            "--control",
            "zmq",
            "--curve",
            "--requests",
            "24",
            "--json",
        ])
        .output()
        .expect("ferry runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["delivered"], 24, "{v}");
    let out = ferry()
        .args(["pipeline", "--curve", "--requests", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--control zmq"));
}
