//! The test-only `delay` data plane (`src/plane/delay.rs`): a plane added
//! by the recipe's files alone (its module, a line in `planes!`, these
//! tests) is reached by name from the library and from `ferry pipeline`
//! with no change of theirs.

use std::process::Command;
use std::time::{Duration, Instant};

use tensorferry::core::slots::{Dtype, TensorSpec};
use tensorferry::plane::DataPlane;
use tensorferry::runtime::{CoordinatorNode, CoordinatorNodeConfig, InstanceNodeConfig};
use tensorferry_shm::UdsChannel;

fn endpoint(dir: &std::path::Path, name: &str) -> String {
    format!("ipc://{}/{name}.sock", dir.display())
}

#[test]
fn a_hand_off_over_the_delay_plane_waits_for_its_held_completion() {
    let dir = std::env::temp_dir().join(format!("ferry-delay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let delay = Duration::from_millis(40);
    let plane = DataPlane::parse("delay", [("over", "local"), ("delay", "40ms")]).unwrap();
    assert_eq!(plane.name(), "delay");
    assert!(!plane.needs_zmq());
    let config = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    let coordinator = CoordinatorNode::start(
        &config,
        UdsChannel::bind(&endpoint(&dir, "coordinator")).unwrap(),
        |_| {},
    )
    .unwrap();
    let start = |role: &str| {
        let settings = InstanceNodeConfig::new(role, coordinator.endpoint());
        let node = plane
            .start_instance_at(&settings, 8 << 20, &endpoint(&dir, role))
            .unwrap();
        node.wait_registered(Duration::from_secs(10)).unwrap();
        node
    };
    let denoiser = start("denoiser");
    let encoder = start("encoder");
    // The plane it wraps is the one named: its session ids are local's.
    assert!(
        encoder.session_id().starts_with("local:"),
        "{}",
        encoder.session_id()
    );
    let bytes: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    let tensors = [TensorSpec {
        field: "latents",
        list_index: None,
        shape: &[bytes.len() as u64],
        dtype: Dtype::UInt8,
        byte_len: bytes.len() as u64,
    }];
    for round in 0..3 {
        let id = format!("req-{round}");
        let mut staging = encoder.stage(&id, &tensors).unwrap();
        staging.tensor_mut(0).unwrap().copy_from_slice(&bytes);
        let committed = Instant::now();
        staging.commit("{}").unwrap();
        let d = denoiser.recv(Duration::from_secs(10)).expect("delivered");
        // The receiver hears of a write only once its completion, held
        // back by the plane, has reached the sender.
        assert!(committed.elapsed() >= delay, "{:?}", committed.elapsed());
        assert_eq!(d.id(), id);
        assert_eq!(d.tensors().next().unwrap().bytes, &bytes[..]);
        d.release();
    }
    drop((encoder, denoiser, coordinator));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_delay_plane_refuses_what_it_cannot_take() {
    let e = DataPlane::parse("delay", [("over", "carrier-pigeon")]).unwrap_err();
    assert!(e.to_string().contains("option over"), "{e}");
    let e = DataPlane::parse("delay", [("delay", "soon")]).unwrap_err();
    assert!(e.to_string().contains("option delay"), "{e}");
    let plane = DataPlane::parse("delay", [("over", "shm")]).unwrap();
    let e = tensorferry::engine::TransferEngine::open(plane).unwrap_err();
    assert!(e.to_string().contains("test plane"), "{e}");
}

#[test]
fn ferry_pipeline_runs_on_the_delay_plane_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "pipeline",
            "--requests",
            "8",
            "--json",
            "--backend",
            "delay",
        ])
        .args([
            "--plane-option",
            "over=local",
            "--plane-option",
            "delay=2ms",
        ])
        .output()
        .expect("ferry runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    assert!(out.status.success(), "{line}");
    let summary: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(summary["ok"], true, "{line}");
    assert_eq!(summary["delivered"], 8, "{line}");
    assert_eq!(summary["data_plane"], "delay", "{line}");
}
