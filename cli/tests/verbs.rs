//! The ibverbs data plane end to end: a coordinator and instances as
//! separate OS processes, the full handshake over ZeroMQ, the bytes by
//! RDMA WRITE over RC queue pairs on the device `FERRY_VERBS_DEVICE`
//! names (a RoCE or InfiniBand NIC, or Soft-RoCE `rxe0`), every byte
//! checked by the receivers.
//!
//! They need a device and the `verbs` feature, so they are ignored unless
//! asked for (`-- --ignored`), and then fail without either, saying why
//! (such as the ENOSYS a kernel without RDMA support returns).
//! The connection logic itself is tested without a device in
//! `backends/verbs` against a software stand-in.

mod common;

use common::scenarios;

fn device() -> String {
    #[cfg(feature = "verbs")]
    return tensorferry_verbs::require_test_device();
    #[cfg(not(feature = "verbs"))]
    panic!("the verbs device tests cannot run: this ferry was built without the `verbs` feature");
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release --features verbs -p tensorferry-cli --test verbs -- --ignored"]
fn verbs_hands_off_random_sizes_byte_exact() {
    let dev = device();
    scenarios::hand_off("verbs", &["--backend", "verbs", "--device", &dev], 1000, 2);
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release --features verbs -p tensorferry-cli --test verbs -- --ignored"]
fn verbs_receiver_killed_mid_run_fails_only_its_requests() {
    let dev = device();
    scenarios::kill_a_receiver("verbs-kill", &["--backend", "verbs", "--device", &dev]);
}

#[test]
#[ignore = "needs an RDMA device: FERRY_VERBS_DEVICE=<device> cargo test --release --features verbs -p tensorferry-cli --test verbs -- --ignored"]
fn the_pipeline_runs_over_verbs_and_survives_a_killed_denoiser() {
    let dev = device();
    let plane = ["--backend", "verbs", "--device", &dev];
    scenarios::pipeline_delivers(&plane);
    scenarios::pipeline_survives_a_killed_denoiser(&plane);
}

/// Runs everywhere: an instance asked for a device that is not there
/// exits with an error that names the verb and errno (no RDMA here) or
/// the devices that are present.
#[cfg(feature = "verbs")]
#[test]
fn an_instance_without_its_device_says_why() {
    let p = common::Procs::new("verbs-nodev");
    let out = common::instance(
        &p,
        "denoiser",
        &p.ep("nowhere"),
        &["--backend", "verbs", "--device", "ferry-no-such-dev0"],
    )
    .output()
    .expect("ferry runs");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"event\":\"error\""), "{text}");
    let named = text.contains("ibv_get_device_list") && text.contains("errno")
        || text.contains("no RDMA device \\\"ferry-no-such-dev0\\\"");
    assert!(named, "{text}");
    // Without --device the instance refuses before touching verbs.
    let out = common::instance(&p, "denoiser", &p.ep("nowhere"), &["--backend", "verbs"])
        .output()
        .expect("ferry runs");
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("--device"), "{all}");
}
