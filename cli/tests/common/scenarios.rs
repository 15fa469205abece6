//! Scenarios the cross-host data planes (libfabric, verbs) share: random
//! sizes through the full handshake with every byte checked, and a
//! receiver killed mid-run. Each takes the data plane's own arguments.

use std::time::{Duration, Instant};

use super::{
    assert_clean, coordinator, ferry, field, named_instance, num, result_endpoints, spawn_encoder,
    Procs,
};

/// Sends `requests` random-size requests (1 byte to 256 MiB) from an
/// encoder to `receivers` denoisers over the data plane `plane` names,
/// and checks that every one arrived intact and nothing is held
/// afterwards.
pub fn hand_off(tag: &str, plane: &[&str], requests: u64, receivers: usize) {
    let mut p = Procs::new(tag);
    let results = result_endpoints(&p, "c");
    // Generous timeouts (the write timeout below the push timeout, as it
    // must be): a 256 MiB write queued behind others on two loaded cores
    // may take seconds, and this test is about bytes, not deadlines.
    let c = p.spawn(
        "coordinator",
        ferry()
            .args(["coordinator", "--control", "zmq"])
            .args(["--listen", &results.join(",")])
            .args(["--push-timeout-ms", "60000"]),
    );
    p.wait_for(c, "\"event\":\"ready\"", 30);
    let requests_arg = requests.to_string();
    let mut plane = plane.to_vec();
    plane.extend([
        "--workload",
        "random",
        "--seed",
        "11",
        "--write-timeout-ms",
        "45000",
    ]);
    let mut rx = Vec::new();
    for k in 0..receivers {
        let name: &'static str = Box::leak(format!("denoiser-{k}").into_boxed_str());
        let i = p.spawn(
            name,
            &mut named_instance(&p, "denoiser", name, &results[1], &plane),
        );
        p.wait_for(i, "\"event\":\"registered\"", 60);
        rx.push(i);
    }
    let more = ["--requests", &requests_arg, "--window", "8"];
    let e = spawn_encoder(&mut p, &results[0], &plane, &more);
    let done = p.wait_for(e, "\"event\":\"encoded\"", 600);
    assert_eq!(num(&done, "sent"), requests, "{done}");
    assert_eq!(num(&done, "send_failed"), 0, "{done}");
    // The sender counts a request sent once its bytes landed; the
    // receiver may still be checking the last ones: wait for the
    // coordinator to see each one released.
    for _ in 0..requests {
        let line = p.wait_for(c, "\"leg\"", 120);
        assert!(line.contains("\"event\":\"delivered\""), "{line}");
    }
    let mut verified = 0;
    for i in rx {
        let s = p.finish(i);
        assert_clean(&s, None);
        verified += num(&s, "verified");
    }
    assert_eq!(verified, requests);
    let s = p.finish(e);
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    let s = p.finish(c);
    assert_eq!(num(&s, "delivered"), requests, "{s}");
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
}

/// Two receivers over `plane`; one is SIGKILLed after 40 deliveries. The
/// writes to it fail (or time out and its connection is dropped), its
/// requests fail, the survivor takes the rest, and nothing stays held.
pub fn kill_a_receiver(tag: &str, plane: &[&str]) {
    let mut p = Procs::new(tag);
    let results = result_endpoints(&p, "c");
    let c = coordinator(&mut p, &results);
    let mut plane = plane.to_vec();
    plane.extend([
        "--workload",
        "random",
        "--max-bytes",
        "4194304",
        "--seed",
        "3",
        "--write-timeout-ms",
        "2000",
    ]);
    let mut rx = Vec::new();
    for name in ["denoiser-0", "denoiser-1"] {
        let i = p.spawn(
            name,
            &mut named_instance(&p, "denoiser", name, &results[1], &plane),
        );
        p.wait_for(i, "\"event\":\"registered\"", 60);
        rx.push(i);
    }
    let requests = 300u64;
    let n = requests.to_string();
    let more = ["--requests", &n, "--window", "8", "--pace-ms", "5"];
    let e = spawn_encoder(&mut p, &results[0], &plane, &more);
    for _ in 0..40 {
        let line = p.wait_for(c, "\"leg\"", 60);
        assert!(line.contains("\"event\":\"delivered\""), "{line}");
    }
    p.kill(rx[1]);
    let killed = Instant::now();
    let done = p.wait_for(e, "\"event\":\"encoded\"", 120);
    let (sent, failed) = (num(&done, "sent"), num(&done, "send_failed"));
    assert_eq!(sent + failed, requests, "{done}");
    assert!(sent > 40, "{done}");
    assert!(
        killed.elapsed() < Duration::from_secs(90),
        "all requests ended {:?} after the kill",
        killed.elapsed()
    );
    let s = p.finish(rx[0]);
    assert_clean(&s, None);
    let s = p.finish(e);
    assert_eq!(num(&s, "requests_held"), 0, "{s}");
    std::thread::sleep(Duration::from_millis(500));
    let s = p.finish(c);
    assert_eq!(num(&s, "in_flight"), 0, "{s}");
}

/// `ferry pipeline --control zmq --json` with `args`; returns its summary
/// line, having checked that it exited successfully.
pub fn pipeline(args: &[&str]) -> String {
    let out = ferry()
        .args(["pipeline", "--control", "zmq", "--json"])
        .args(args)
        .output()
        .expect("ferry runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().last().unwrap_or("").to_owned();
    assert!(
        out.status.success(),
        "{line}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    line
}

/// `ferry pipeline` over `plane`: 16 requests of realistic tensors through
/// both legs, every byte checked by the denoisers and the decoder.
pub fn pipeline_delivers(plane: &[&str]) {
    let mut a = plane.to_vec();
    a.extend(["--requests", "16"]);
    let line = pipeline(&a);
    assert_eq!(field(&line, "ok"), "true", "{line}");
    assert_eq!(num(&line, "delivered"), 16, "{line}");
}

/// `ferry pipeline` over `plane` with denoiser 1 killed after 8
/// deliveries: every one of 48 requests ends, delivered or failed, and
/// nothing delivered is wrong.
pub fn pipeline_survives_a_killed_denoiser(plane: &[&str]) {
    let mut a = plane.to_vec();
    a.extend([
        "--requests",
        "48",
        "--kill",
        "1@8",
        "--push-timeout-ms",
        "8000",
    ]);
    let line = pipeline(&a);
    assert_eq!(field(&line, "ok"), "true", "{line}");
    assert_eq!(field(&line, "incomplete"), "false", "{line}");
    assert_eq!(num(&line, "mismatches"), 0, "{line}");
    assert_eq!(num(&line, "delivered") + num(&line, "failed"), 48, "{line}");
}
