//! Restarts mid-run, as separate processes over ZeroMQ: the coordinator is
//! killed and started again at the same endpoints, then a denoiser is killed
//! and replaced. Transfers in flight fail cleanly (every request of the
//! running encoder ends, sent or failed, and nobody is left holding a
//! slot); requests after the restarts go through once everyone has
//! registered again.

mod common;

use std::time::Duration;

use common::{assert_clean, coordinator, named_instance, num, result_endpoints, Procs};

/// A denoiser at the one denoiser endpoint, slow enough (60 ms a request)
/// that work is in flight when something dies.
fn denoiser(p: &mut Procs, results: &[String], label: &'static str) -> usize {
    let mut cmd = named_instance(
        p,
        "denoiser",
        "denoiser",
        &results[1],
        &["--prealloc", "2:16", "--hold-ms", "60"],
    );
    p.spawn(label, &mut cmd)
}

#[test]
fn coordinator_and_instance_restarts_fail_in_flight_work_cleanly() {
    const N: u64 = 150;
    let mut p = Procs::new("restart");
    let results = result_endpoints(&p, "coordinator");
    let c1 = coordinator(&mut p, &results);
    let d1 = denoiser(&mut p, &results, "denoiser");
    let mut cmd = named_instance(&p, "decoder", "decoder", &results[2], &[]);
    let dec = p.spawn("decoder", &mut cmd);
    p.wait_for(d1, "\"event\":\"registered\"", 30);
    p.wait_for(dec, "\"event\":\"registered\"", 30);
    let n = N.to_string();
    let mut cmd = named_instance(
        &p,
        "encoder",
        "encoder",
        &results[0],
        &["--requests", &n, "--window", "4", "--pace-ms", "20"],
    );
    let enc = p.spawn("encoder", &mut cmd);
    p.wait_for(enc, "\"event\":\"registered\"", 30);

    // The coordinator dies with work in flight and comes back.
    std::thread::sleep(Duration::from_millis(800));
    p.kill(c1);
    std::thread::sleep(Duration::from_millis(200));
    let c2 = coordinator(&mut p, &results);
    // A denoiser dies with work in flight and is replaced at its endpoint.
    std::thread::sleep(Duration::from_millis(800));
    p.kill(d1);
    let d2 = denoiser(&mut p, &results, "denoiser-2");
    // The replacement removes what the killed one left in shared memory.
    let removed = p.wait_for(d2, "\"event\":\"stale_pools_removed\"", 30);
    let removed: serde_json::Value = serde_json::from_str(&removed).unwrap();
    assert_eq!(
        removed["objects"].as_array().map(Vec::len),
        Some(1),
        "{removed}"
    );
    p.wait_for(d2, "\"event\":\"registered\"", 30);

    // Every request of the running encoder ended, one way or the other.
    let encoded = p.wait_for(enc, "\"event\":\"encoded\"", 120);
    let (sent, failed) = (num(&encoded, "sent"), num(&encoded, "send_failed"));
    assert_eq!(sent + failed, N, "{encoded}");
    assert!(sent > N / 2, "{encoded}");

    // After the restarts, new requests all go through.
    let mut cmd = named_instance(
        &p,
        "encoder",
        "encoder-2",
        &results[0],
        &["--requests", "12", "--window", "4"],
    );
    let enc2 = p.spawn("encoder-2", &mut cmd);
    let encoded2 = p.wait_for(enc2, "\"event\":\"encoded\"", 60);
    assert_eq!(
        (num(&encoded2, "sent"), num(&encoded2, "send_failed")),
        (12, 0),
        "{encoded2}"
    );

    // Quarantines end; then nobody holds anything and no byte was wrong.
    std::thread::sleep(Duration::from_millis(1500));
    for i in [enc, enc2, d2, dec] {
        assert_clean(&p.finish(i), None);
    }
    let cs = p.finish(c2);
    // The killed denoiser's pool went when its replacement started, and
    // every process that finished removed its own.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(p.clean_shm(), (0, 0));
    // The denoiser held work when it was killed: those transfers failed
    // (and the encoder's waiting ones when the coordinator died).
    assert!(
        num(&cs, "failed") + failed > 0,
        "nothing failed: {cs} {encoded}"
    );
    assert_eq!(num(&cs, "in_flight"), 0, "{cs}");
    assert_eq!(num(&cs, "prealloc_taken"), 0, "{cs}");
}
