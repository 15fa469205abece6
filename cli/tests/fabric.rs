//! The libfabric data plane end to end: a coordinator and instances as
//! separate OS processes, the full handshake over ZeroMQ, and the bytes
//! over real providers (`tcp;ofi_rxm` on loopback, `shm`). Thousands of
//! requests of random sizes from 1 byte to 256 MiB; the receiver checks
//! every byte of each at the moment it is handed over.
#![cfg(feature = "fabric")]

mod common;

use common::scenarios;

/// `--backend fabric` over `provider` with `delivery` (bound to loopback
/// for tcp).
fn plane<'a>(provider: &'a str, delivery: &'a str) -> Vec<&'a str> {
    let mut a = vec![
        "--backend",
        "fabric",
        "--provider",
        provider,
        "--delivery",
        delivery,
    ];
    if provider.starts_with("tcp") {
        a.extend(["--fabric-source", "127.0.0.1"]);
    }
    a
}

fn hand_off(tag: &str, provider: &str, delivery: &str, requests: u64, receivers: usize) {
    scenarios::hand_off(tag, &plane(provider, delivery), requests, receivers);
}

#[test]
fn tcp_hands_off_thousands_of_random_sizes_with_delivery_complete() {
    hand_off("fab-tcp-dc", "tcp;ofi_rxm", "delivery-complete", 2000, 2);
}

#[test]
fn tcp_hands_off_thousands_of_random_sizes_with_counted_notices() {
    hand_off("fab-tcp-n", "tcp;ofi_rxm", "remote-cq-data", 2000, 1);
}

#[test]
fn shm_provider_hands_off_thousands_of_random_sizes() {
    hand_off("fab-shm", "shm", "auto", 2000, 2);
}

#[test]
fn bench_compares_hand_offs_with_raw_writes_on_both_providers() {
    // Functional only (timing belongs to the benchmark itself): every size
    // is measured for ferry and for the baseline.
    for (provider, extra) in [("shm", None), ("tcp;ofi_rxm", Some("127.0.0.1"))] {
        let mut c = common::ferry();
        c.args(["bench", "--backend", "fabric", "--provider", provider])
            .args(["--against", "raw"])
            .args(["--seconds", "0.4", "--sizes", "4K,1M,64M", "--json"])
            .env("FERRY_LOG", "warn");
        if let Some(src) = extra {
            c.args(["--fabric-source", src]);
        }
        let out = c.output().expect("ferry runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains(&format!("\"provider\":\"{provider}\"")),
            "{text}"
        );
        for size in ["4096", "1048576"] {
            assert!(text.contains(&format!("\"size\":{size},")), "{text}");
        }
        assert!(!text.contains("\"transfers\":0,"), "{text}");
        assert!(!text.contains("\"raw_writes\":0,"), "{text}");
        // A healthy run says nothing alarming: a warning or an error must
        // mean something is wrong.
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            !log.contains("ERROR") && !log.contains("WARN"),
            "{provider}: {log}"
        );
    }
}

#[test]
fn bench_runs_the_hand_off_rig_over_libfabric_with_zeromq_control() {
    // Functional only: without `--against raw`, `--backend fabric` runs the
    // rig every data plane runs (against memcpy), its nodes over ZeroMQ.
    let out = common::ferry()
        .args(["bench", "--backend", "fabric", "--provider", "tcp;ofi_rxm"])
        .args(["--fabric-source", "127.0.0.1"])
        .args(["--seconds", "0.3", "--sizes", "4K,1M", "--json"])
        .env("FERRY_LOG", "warn")
        .output()
        .expect("ferry runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{log}");
    assert!(
        text.starts_with(r#"{"plane":"fabric","control":"zmq","#),
        "{text}"
    );
    for size in ["4096", "1048576"] {
        assert!(text.contains(&format!("\"size\":{size},")), "{text}");
    }
    assert!(!text.contains("\"iterations\":0,"), "{text}");
    assert!(!log.contains("ERROR") && !log.contains("WARN"), "{log}");
}

/// A receiver killed mid-run: the writes to it fail (or time out and its
/// connection is dropped), its requests fail, the survivor takes the rest,
/// and nothing stays held.
#[test]
fn a_receiver_killed_mid_run_fails_only_its_requests() {
    scenarios::kill_a_receiver("fab-kill", &plane("tcp;ofi_rxm", "auto"));
}

/// `ferry pipeline` over libfabric: realistic tensors through both legs,
/// every byte checked by the denoisers and the decoder; then over tcp with
/// a denoiser killed mid-run.
#[test]
fn the_pipeline_runs_over_libfabric_and_survives_a_killed_denoiser() {
    scenarios::pipeline_delivers(&["--backend", "fabric", "--provider", "shm"]);
    scenarios::pipeline_survives_a_killed_denoiser(&plane("tcp;ofi_rxm", "auto"));
}
