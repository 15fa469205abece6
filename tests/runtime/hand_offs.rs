//! Hand-offs that deliver every byte: over both paths, through three
//! roles under one id, over the in-process channel, and over the verbs
//! transport on its stand-in device.

#[cfg(feature = "verbs-sim")]
use tensorferry::runtime::InstanceNode;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNodeConfig, Prealloc,
};
#[cfg(feature = "verbs-sim")]
use tensorferry_shm::UdsChannel;

#[cfg(feature = "verbs-sim")]
use super::check_all;
use super::{
    assert_idle, check, coordinator, instance, mib_slots, pattern, send, wait_delivered, SECOND,
};
#[cfg(feature = "verbs-sim")]
use crate::common::endpoint;

#[test]
fn hand_offs_over_both_paths_deliver_every_byte() {
    let coord = coordinator(&["encoder", "denoiser"]);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    // Two preallocated slots: the fast path; more requests take the slow one.
    let den = instance("denoiser", &coord, mib_slots(2));
    for round in 0..20u8 {
        let ids: Vec<String> = (0..4).map(|i| format!("r{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            send(&enc, id, round.wrapping_mul(7).wrapping_add(i as u8));
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            let d = den.recv(5 * SECOND).expect("a delivery");
            got.push(d.id().to_owned());
            let i: usize = d.id().rsplit('-').next().unwrap().parse().unwrap();
            let seed = round.wrapping_mul(7).wrapping_add(i as u8);
            for (k, t) in d.tensors().enumerate() {
                assert_eq!(t.bytes, pattern(seed.wrapping_add(k as u8), t.bytes.len()));
            }
            d.release();
        }
        got.sort();
        assert_eq!(got, ids);
        for _ in 0..4 {
            assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
        }
    }
    assert_idle(&enc);
    assert_idle(&den);
    wait_delivered(&coord, 80);
    let snap = coord.snapshot();
    assert_eq!(snap.stats.delivered, 80);
    assert!(
        snap.stats.fast_path > 0 && snap.stats.fast_path < 80,
        "{snap:?}"
    );
    // Each write moves the slot's data: 5,082 bytes padded to 5,120, then
    // 20,000 padded to 20,480.
    assert_eq!(enc.stats().metrics.bytes_written, 80 * 25_600);
}

#[test]
fn one_request_passes_through_three_roles_under_its_own_id() {
    let coord = coordinator(&["encoder", "denoiser", "decoder"]);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    let den = instance("denoiser", &coord, mib_slots(1));
    let dec = instance("decoder", &coord, Prealloc::NONE);
    send(&enc, "req-1", 3);
    let input = den.recv(5 * SECOND).expect("at the denoiser");
    // Forward before letting go of the input, as a denoiser would.
    send(&den, "req-1", 9);
    input.release();
    check(&dec, "req-1", 9);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
    assert!(den.next_outcome(5 * SECOND).unwrap().sent);
    for n in [&enc, &den, &dec] {
        assert_idle(n);
    }
}

#[test]
fn the_in_process_channel_carries_a_hand_off() {
    use tensorferry_shm::{MemChannel, MemHub};

    let hub = MemHub::new();
    let _coordinator = CoordinatorNode::start(
        &CoordinatorNodeConfig::new(&["encoder", "denoiser"]),
        MemChannel::bind(&hub, "coordinator").unwrap(),
        |_| {},
    )
    .unwrap();
    let node = |role: &str| {
        let h = hub.clone();
        let name = format!("mem-{role}");
        DataPlane::default()
            .start_instance(
                &InstanceNodeConfig::new(role, "coordinator"),
                16 << 20,
                MemChannel::bind(&h, &name).unwrap(),
            )
            .unwrap()
    };
    let (enc, den) = (node("encoder"), node("denoiser"));
    enc.wait_registered(5 * SECOND).unwrap();
    den.wait_registered(5 * SECOND).unwrap();
    send(&enc, "m1", 5);
    check(&den, "m1", 5);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
}

/// The runtime over the verbs transport, with the NIC replaced by the
/// software stand-in: the connection exchange over the real side channel,
/// chunked RDMA writes within the window, completions raised on the wake
/// descriptor and reaped by the runtime's progress thread; every byte
/// checked. (Feature `verbs-sim`, which `scripts/test` turns on.)
#[cfg(feature = "verbs-sim")]
#[test]
fn the_runtime_hands_off_over_the_verbs_transport_on_a_stand_in_device() {
    use tensorferry_verbs::sim::SimDevice;
    use tensorferry_verbs::{VerbsConfig, VerbsTransport};

    let coord = coordinator(&["encoder", "denoiser"]);
    let node = |role: &str, prealloc: Prealloc| {
        // Small messages and a small window, so writes are chunked and
        // the window fills.
        let mut config = VerbsConfig::new("sim");
        config.send_depth = 8;
        let device = SimDevice::new([127, 0, 0, 1], 4096);
        let transport = VerbsTransport::with_device_and_pool(device, &config, 16 << 20).unwrap();
        let mut s = InstanceNodeConfig::new(role, coord.endpoint());
        s.config.prealloc = prealloc;
        let ch = UdsChannel::bind(&endpoint(role)).unwrap();
        let n = InstanceNode::start(&s, transport, ch).unwrap();
        n.wait_registered(5 * SECOND).unwrap();
        n
    };
    let enc = node("encoder", Prealloc::NONE);
    let den = node("denoiser", mib_slots(2));
    for round in 0..10u8 {
        let requests: Vec<(String, u8)> = (0..4u8)
            .map(|i| {
                (
                    format!("v{round}-{i}"),
                    round.wrapping_mul(5).wrapping_add(i),
                )
            })
            .collect();
        for (id, seed) in &requests {
            send(&enc, id, *seed);
        }
        check_all(&den, &requests);
        for _ in 0..4 {
            assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
        }
    }
    assert_idle(&enc);
    assert_idle(&den);
    wait_delivered(&coord, 40);
    assert_eq!(enc.stats().metrics.bytes_written, 40 * 25_600);
    drop((enc, den));
}
