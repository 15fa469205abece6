//! Faults: a receiver gone, faults injected into the channels and the
//! data plane, writes that never land; every request ends and nothing
//! stays held.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, DataPlane, InstanceNodeConfig, Prealloc,
};
use tensorferry_shm::UdsChannel;

use super::{
    assert_idle, check, coordinator, coordinator_with, instance, mib_slots, pattern, send, SECOND,
};
use crate::common::endpoint;

#[test]
fn without_a_live_receiver_a_request_fails_and_a_new_receiver_takes_over() {
    let mut settings = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    settings.config.timeouts.queued = Duration::from_millis(300);
    let coord = coordinator_with(settings);
    let enc = instance("encoder", &coord, Prealloc::NONE);
    let den = instance("denoiser", &coord, Prealloc::NONE);
    send(&enc, "ok-1", 1);
    check(&den, "ok-1", 1);
    assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
    // The receiver goes away: its pool object is unlinked and its
    // connections close, so the coordinator drops it at once.
    drop(den);
    for _ in 0..500 {
        if coord.snapshot().members == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(coord.snapshot().members, 1);
    send(&enc, "lost-1", 2);
    let o = enc.next_outcome(10 * SECOND).expect("an outcome");
    assert_eq!((o.id.as_str(), o.sent), ("lost-1", false));
    // A new receiver takes over.
    let den2 = instance("denoiser", &coord, Prealloc::NONE);
    send(&enc, "ok-2", 4);
    check(&den2, "ok-2", 4);
    assert_idle(&enc);
    assert_idle(&den2);
}

#[test]
fn under_injected_faults_every_request_ends_and_no_slot_leaks() {
    use tensorferry::fault::{FaultPlan, FaultyChannel, FaultyTransport};
    use tensorferry_core::handshake::coordinator::Timeouts;

    let plan = |seed| FaultPlan {
        fail_write: 0.1,
        delay_write: 0.05,
        drop: 0.02,
        duplicate: 0.03,
        delay_message: 0.05,
        lose_notice: 0.0,
        delay: Duration::from_millis(30),
        seed,
        ..FaultPlan::NONE
    };
    let mut cs = CoordinatorNodeConfig::new(&["encoder", "denoiser"]);
    cs.config.timeouts = Timeouts {
        queued: Duration::from_secs(2),
        alloc: Duration::from_millis(300),
        push: Duration::from_millis(500),
        done: Duration::from_secs(1),
    };
    cs.config.quarantine = Duration::from_millis(200);
    cs.config.late_done_wait = Duration::from_millis(500);
    let ch = FaultyChannel::new(UdsChannel::bind(&endpoint("coord")).unwrap(), plan(1));
    let coord = CoordinatorNode::start(&cs, ch, |_| {}).unwrap();
    let settings = |role: &str, prealloc| {
        let mut s = InstanceNodeConfig::new(role, coord.endpoint());
        s.config.prealloc = prealloc;
        s.config.register_retry = Duration::from_millis(50);
        s.config.staged_timeout = Duration::from_secs(4);
        s.config.reserved_timeout = Duration::from_secs(1);
        s.config.quarantine = Duration::from_millis(200);
        s
    };
    let uds = |role| UdsChannel::bind(&endpoint(role)).unwrap();
    let enc = DataPlane::default()
        .start_instance_with(
            &settings("encoder", Prealloc::NONE),
            64 << 20,
            FaultyChannel::new(uds("encoder"), plan(3)),
            |t| FaultyTransport::new(t, plan(2)),
        )
        .unwrap();
    let den = DataPlane::default()
        .start_instance(
            &settings("denoiser", mib_slots(2)),
            64 << 20,
            FaultyChannel::new(uds("denoiser"), plan(4)),
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    den.wait_registered(5 * SECOND).unwrap();

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (delivered, outcomes) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let Some(d) = den.recv(Duration::from_millis(50)) else {
                    continue;
                };
                let seed: u8 = d.id()[2..].parse::<u32>().unwrap() as u8;
                for (k, t) in d.tensors().enumerate() {
                    assert_eq!(
                        t.bytes,
                        pattern(seed.wrapping_add(k as u8), t.bytes.len()),
                        "{}",
                        d.id()
                    );
                }
                seen.push(d.id().to_owned());
                d.release();
            }
            seen
        });
        let mut outcomes = Vec::new();
        for wave in 0..25u32 {
            for i in 0..8 {
                let n = wave * 8 + i;
                send(&enc, &format!("f-{n}"), n as u8);
            }
            for _ in 0..8 {
                // Every request ends within the sender's staged timeout.
                let o = enc.next_outcome(6 * SECOND).expect("every request ends");
                outcomes.push(o);
            }
        }
        // Late and delayed messages still arrive; keep receiving until
        // quarantines and late waits are over.
        std::thread::sleep(Duration::from_millis(1500));
        stop.store(true, Ordering::Relaxed);
        (receiver.join().unwrap(), outcomes)
    });
    assert_eq!(outcomes.len(), 200);
    let sent = outcomes.iter().filter(|o| o.sent).count();
    // Faults took some, and most got through.
    assert!((100..200).contains(&sent), "{sent} of 200 sent");
    // Nothing was delivered twice, and nothing unsent was delivered.
    let mut unique = delivered.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), delivered.len());
    for id in &delivered {
        let o = outcomes.iter().find(|o| o.id.as_str() == id).unwrap();
        assert!(o.sent, "{id} delivered but reported unsent");
    }
    // Nothing is held anywhere any more.
    assert_idle(&enc);
    assert_idle(&den);
    for _ in 0..300 {
        let snap = coord.snapshot();
        if snap.in_flight == 0 && snap.prealloc_taken == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("coordinator still holds transfers: {:?}", coord.snapshot());
}

/// Where completions do not mean delivery, a receiver takes a transfer only
/// once its write is reported landed; one whose notice never comes is
/// refused after the landing timeout, and nothing stays held.
#[test]
fn a_transfer_whose_write_never_lands_is_refused_and_freed() {
    use tensorferry::fault::{FaultPlan, FaultyTransport, Notices};

    let coord = coordinator(&["encoder", "denoiser"]);
    // The encoder's transport posts a notice for each write that
    // completed, and loses half of them; the denoiser's reports them.
    let notices = Notices::default();
    let sender_notices = notices.clone();
    let enc = DataPlane::default()
        .start_instance_with(
            &InstanceNodeConfig::new("encoder", coord.endpoint()),
            64 << 20,
            UdsChannel::bind(&endpoint("encoder")).unwrap(),
            |t| {
                let plan = FaultPlan {
                    lose_notice: 0.5,
                    seed: 9,
                    ..FaultPlan::default()
                };
                FaultyTransport::with_notices(t, plan, sender_notices)
            },
        )
        .unwrap();
    enc.wait_registered(5 * SECOND).unwrap();
    let mut s = InstanceNodeConfig::new("denoiser", coord.endpoint());
    s.config.prealloc = mib_slots(2);
    s.config.landing_timeout = Duration::from_millis(300);
    let den = DataPlane::default()
        .start_instance_with(
            &s,
            64 << 20,
            UdsChannel::bind(&endpoint("denoiser")).unwrap(),
            |t| FaultyTransport::with_notices(t, FaultPlan::default(), notices),
        )
        .unwrap();
    den.wait_registered(5 * SECOND).unwrap();
    let n = 24u32;
    let (mut delivered, mut refused) = (0, 0);
    for i in 0..n {
        let id = format!("n-{i}");
        send(&enc, &id, i as u8);
        let o = enc.next_outcome(5 * SECOND).expect("the write completes");
        assert!(o.sent, "the bytes were written");
        match den.recv(SECOND) {
            Some(d) => {
                assert_eq!(d.id(), id);
                for (k, t) in d.tensors().enumerate() {
                    assert_eq!(
                        t.bytes,
                        pattern((i as u8).wrapping_add(k as u8), t.bytes.len())
                    );
                }
                d.release();
                delivered += 1;
            }
            None => refused += 1,
        }
    }
    assert!(
        delivered > 0 && refused > 0,
        "{delivered} delivered, {refused} refused"
    );
    for _ in 0..300 {
        let snap = coord.snapshot();
        if snap.stats.delivered == delivered && snap.stats.failed == refused && snap.in_flight == 0
        {
            assert_idle(&enc);
            assert_idle(&den);
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "{delivered} delivered, {refused} refused: {:?}",
        coord.snapshot()
    );
}
