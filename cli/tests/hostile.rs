//! Hostile and buggy peers against real `ferry coordinator` and
//! `ferry instance` processes over ZeroMQ: forged and malformed messages
//! from a raw ZeroMQ socket, registrations that must be refused, restarts
//! that reuse names, and output that peers can put text into. Nothing may
//! crash, nothing may be accepted that should not be, and every refusal
//! must say why.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::flood::{
    aim, flood_of_known_ids_changes_nothing, flood_through_handoffs, forger, written_at_the_top,
    MAGIC,
};
use common::{
    coordinator, coordinator_with, free_port, instance_at, named_instance, num, result_endpoints,
    spawn_encoder, tcp, Procs, SMALL_RANDOM,
};
use serde_json::Value;
use tensorferry_zmq::zmq;

/// A random-workload instance (small requests), at `endpoint`.
fn random(
    p: &Procs,
    role: &str,
    name: &str,
    coordinator: &str,
    extra: &[&str],
) -> std::process::Command {
    let mut c = named_instance(p, role, name, coordinator, &SMALL_RANDOM);
    c.args(extra);
    c
}

/// A coordinator at `results`, ready, and a random-workload denoiser
/// registered with it: their indices and the denoiser's `registered` line.
fn with_a_denoiser(p: &mut Procs, results: &[String]) -> (usize, usize, String) {
    let c = coordinator(p, results);
    let mut cmd = random(p, "denoiser", "denoiser", &results[1], &[]);
    let d = p.spawn("denoiser", &mut cmd);
    let registered = p.wait_for(d, "\"event\":\"registered\"", 30);
    (c, d, registered)
}

fn send(s: &zmq::Socket, payload: &str) {
    s.send_multipart([MAGIC, payload.as_bytes()], 0).unwrap();
}

#[test]
fn request_ids_with_quotes_backslashes_and_newlines_stay_inside_their_json_strings() {
    let mut p = Procs::new("json");
    let results = result_endpoints(&p, "c");
    let (c, d, _) = with_a_denoiser(&mut p, &results);
    // The encoder's name goes into every request id it makes.
    let name = "e\"vil\\\n\",\"event\":\"forged";
    let mut cmd = instance_at("encoder", name, &results[0], &p.ep("enc"));
    cmd.args(SMALL_RANDOM).args(["--requests", "3"]);
    let e = p.spawn("encoder", &mut cmd);
    let encoded = p.wait_for(e, "\"event\":\"encoded\"", 60);
    let encoded: Value = serde_json::from_str(&encoded).unwrap();
    assert_eq!(encoded["sent"], 3, "{encoded}");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let line = p.wait_for(c, "\"event\":\"delivered\"", 30);
        // One object per line, whatever the id holds.
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["event"], "delivered", "{line}");
        ids.push(v["id"].as_str().unwrap().to_owned());
    }
    ids.sort();
    assert_eq!(
        ids,
        (0..3).map(|n| format!("{name}-{n}")).collect::<Vec<_>>()
    );
    let s = p.finish(e);
    let s: Value = serde_json::from_str(&s).unwrap();
    assert_eq!(s["name"], name);
    for i in [d, c] {
        let line = p.finish(i);
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
}

#[test]
fn a_pool_too_small_for_its_slots_is_refused_with_what_it_needs() {
    let p = Procs::new("pool");
    let out = named_instance(
        &p,
        "decoder",
        "decoder",
        &p.ep("nobody"),
        &[
            "--workload",
            "random",
            "--max-bytes",
            "1000",
            "--pool-mib",
            "4",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert!(!out.status.success());
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    let error = v["error"].as_str().unwrap();
    assert!(error.contains("--pool-mib 4 is too small"), "{error}");
    assert!(error.contains("--pool-mib 66 or more"), "{error}");
    assert!(!error.contains("multiple of min_block"), "{error}");
}

#[test]
fn refused_registrations_say_why_on_both_sides() {
    let mut p = Procs::new("refuse");
    let results = result_endpoints(&p, "c");
    let c = coordinator(&mut p, &results);
    let out = named_instance(&p, "overlord", "overlord", &results[0], &[])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.contains("refused the registration: unknown role"),
        "{line}"
    );
    let refused = p.wait_for(c, "\"event\":\"refused\"", 30);
    let v: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(
        (v["reason"].as_str(), v["answered"].as_bool()),
        (Some("unknown role"), Some(true))
    );
}

#[test]
fn an_admission_list_drops_other_endpoints_and_a_ghost_endpoint_is_dropped_too() {
    let mut p = Procs::new("admit");
    let results = result_endpoints(&p, "c");
    let good = p.ep("good");
    let c = coordinator_with(&mut p, &results, &["--denoiser-urls", &good]);
    // An endpoint not on the list: dropped unanswered, and said.
    let mut cmd = random(&p, "denoiser", "stranger", &results[1], &[]);
    let stranger = p.spawn("stranger", &mut cmd);
    let refused = p.wait_for(c, "\"event\":\"refused\"", 30);
    assert!(
        refused.contains("not admitted") && refused.contains("\"answered\":false"),
        "{refused}"
    );
    p.kill(stranger);
    // The admitted one registers.
    let d = p.spawn(
        "good",
        &mut random(&p, "denoiser", "good", &results[1], &[]),
    );
    p.wait_for(d, "\"event\":\"registered\"", 30);
    p.wait_for(c, "\"event\":\"registered\"", 30);

    // Without a list: a registration naming an endpoint nobody serves is
    // found out and dropped, so it takes no hand-off.
    let results = result_endpoints(&p, "open");
    let (open, _, _) = with_a_denoiser(&mut p, &results);
    p.wait_for(open, "\"event\":\"registered\"", 30);
    let ctx = zmq::Context::new();
    let to_coordinator = forger(&ctx, &results[1]);
    let ghost = p.ep("ghost");
    send(
        &to_coordinator,
        &serde_json::json!({
            "msg_type": "transfer_register", "role": "denoiser", "session_id": "ghost",
            "pool_ptr": 4096, "pool_size": 1 << 26, "work_endpoint": ghost,
            // More free slots than the real denoiser: the receiver a
            // most-free-slots policy picks first.
            "preallocated_slots": (0..8u64).map(|k| serde_json::json!({
                "offset": k << 20, "size": 1 << 20, "slot_id": k, "addr": 4096 + (k << 20),
            })).collect::<Vec<_>>(),
        })
        .to_string(),
    );
    p.wait_for(open, "\"event\":\"registered\"", 30);
    std::thread::sleep(Duration::from_millis(500));
    let e = spawn_encoder(
        &mut p,
        &results[0],
        &SMALL_RANDOM,
        &["--requests", "8", "--window", "2"],
    );
    let encoded = p.wait_for(e, "\"event\":\"encoded\"", 60);
    assert_eq!(
        (num(&encoded, "sent"), num(&encoded, "send_failed")),
        (8, 0),
        "{encoded}"
    );
}

#[test]
fn an_encoder_restarted_under_its_old_name_is_told_its_ids_are_taken() {
    let mut p = Procs::new("dupname");
    let results = result_endpoints(&p, "c");
    let (_c, _, _) = with_a_denoiser(&mut p, &results);
    let run = |p: &mut Procs, label: &'static str| {
        let mut cmd = instance_at("encoder", "enc", &results[0], &p.ep(label));
        cmd.args(SMALL_RANDOM).args(["--requests", "3"]);
        let e = p.spawn(label, &mut cmd);
        let encoded = p.wait_for(e, "\"event\":\"encoded\"", 60);
        p.kill(e);
        serde_json::from_str::<Value>(&encoded).unwrap()
    };
    let first = run(&mut p, "first");
    assert_eq!(
        (first["sent"].as_u64(), first["send_failed"].as_u64()),
        (Some(3), Some(0))
    );
    let again = run(&mut p, "again");
    assert_eq!(
        (again["sent"].as_u64(), again["send_failed"].as_u64()),
        (Some(0), Some(3)),
        "{again}"
    );
    let failures = again["failures"].as_object().unwrap();
    assert!(
        failures
            .keys()
            .all(|k| k.contains("request id already used")),
        "{again}"
    );
}

#[test]
fn a_flood_of_forged_messages_from_outside_the_allow_list_changes_nothing() {
    let mut p = Procs::new("flood");
    let results: Vec<String> = (0..3).map(|_| tcp(free_port())).collect();
    let allow = ["--allow-from", "127.0.0.1"];
    let c = coordinator_with(&mut p, &results, &allow);
    let den_ep = tcp(free_port());
    let mut cmd = instance_at("denoiser", "denoiser", &results[1], &den_ep);
    cmd.args(SMALL_RANDOM).args(allow);
    let d = p.spawn("denoiser", &mut cmd);
    let registered = p.wait_for(d, "\"event\":\"registered\"", 30);
    let enc_ep = tcp(free_port());
    let mut cmd = instance_at("encoder", "encoder", &results[0], &enc_ep);
    cmd.args(SMALL_RANDOM)
        .args(["--requests", "200", "--window", "2", "--pace-ms", "5"])
        .args(allow);
    let e = p.spawn("encoder", &mut cmd);

    // From 127.0.0.2, at the denoiser's work endpoint, the encoder's, and
    // every result endpoint of the coordinator.
    let ctx = zmq::Context::new();
    let from_outside = |to: &str| {
        forger(
            &ctx,
            &format!("tcp://127.0.0.2:0;{}", to.trim_start_matches("tcp://")),
        )
    };
    let targets: Vec<zmq::Socket> = [&den_ep, &enc_ep]
        .into_iter()
        .chain(&results)
        .map(|t| from_outside(t))
        .collect();
    flood_of_known_ids_changes_nothing(&mut p, targets, &registered, (d, e, c));
}

#[test]
fn a_flood_of_forged_messages_for_unknown_ids_costs_only_counters() {
    let mut p = Procs::new("flood-in");
    let results = result_endpoints(&p, "c");
    let (c, d, registered) = with_a_denoiser(&mut p, &results);
    let (session, dest) = aim(&registered);
    let e = spawn_encoder(
        &mut p,
        &results[0],
        &SMALL_RANDOM,
        &["--requests", "200", "--window", "2", "--pace-ms", "5"],
    );
    // From where the peers are (the same host, ipc): forged messages the
    // state machines see, for ids they do not hold.
    let ctx = zmq::Context::new();
    let targets: Vec<zmq::Socket> = [p.ep("denoiser")]
        .iter()
        .chain(&results)
        .map(|t| forger(&ctx, t))
        .collect();
    flood_through_handoffs(&mut p, targets, &session, dest, false, e, c, 200);
    assert_eq!(written_at_the_top(&p, &registered), 0);
    let s = p.finish(d);
    // Every byte the denoiser handed over was the encoder's; the forgeries
    // were counted.
    assert_eq!(
        (num(&s, "verified"), num(&s, "mismatches")),
        (200, 0),
        "{s}"
    );
    assert!(num(&s, "ignored") > 0, "{s}");
    let s = p.finish(c);
    assert_eq!(num(&s, "delivered"), 200, "{s}");
    assert!(num(&s, "ignored") > 0, "{s}");
}
