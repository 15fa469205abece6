//! Each documented path of the handshake, walked step by step with a
//! coordinator and real instances exchanging encoded messages. The world
//! they walk in (the machines, and the synchronous pump between them) is in
//! `paths/`, built over the harness the simulation and the fuzz target
//! share (`harness/`).

mod harness;
#[macro_use]
mod paths;

use std::time::Duration;

use harness::{blob, incoming};
use paths::*;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant, PeerId, REASON_LEN};
use tensorferry_core::json::RawJson;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::transport::{Incoming, Landed, WriteTag};
use tensorferry_core::wire::{decode, Manifest, Msg, MsgType, TensorEntry};

#[test]
fn fast_path_uses_a_preallocated_slot() {
    world!(w, 8);
    w.stage(0, "r1", 6 * KIB);
    assert_eq!((w.sent(MsgType::Alloc), w.sent(MsgType::Push)), (0, 1));
    assert_eq!(w.coord.stats().fast_path, 1);
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    let rx = w.insts[1].received(token).unwrap();
    assert_eq!((rx.id, rx.slot_size), ("r1", 8 * KIB));
    assert_eq!(rx.manifest.validate(), Ok(1));
    assert_eq!(rx.scalar_fields.as_str(), r#"{"prompt":"a cat"}"#);
    assert_eq!(w.insts[1].prealloc_in_use(), 1);
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    // staged, pushed and done were each traced to their sender by content.
    assert_eq!(w.judged, 3);
    assert!(w.inst_events.iter().any(
        |(i, e)| *i == 0 && matches!(e, InstanceEvent::Sent { id, .. } if id.as_str() == "r1")
    ));
    w.assert_clean();
}

#[test]
fn each_phase_of_a_hand_off_is_timed_on_the_given_clock() {
    world!(w, 8);
    w.writes = None;
    w.stage(0, "r1", 6 * KIB);
    // The push went out at once (fast path); the write takes 3 ms.
    w.advance(3);
    let (i, write) = w.pending.pop().unwrap();
    w.insts[i]
        .handle_completion(w.now, write.token, Ok(()))
        .unwrap();
    w.pump();
    let sent: Vec<_> = w
        .inst_events
        .iter()
        .filter_map(|(_, e)| match e {
            InstanceEvent::Sent { timing, .. } => Some(*timing),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent,
        [SendTiming {
            queued: Duration::ZERO,
            written: Duration::from_millis(3),
        }]
    );
    // The receiver holds it for 2 ms.
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.advance(2);
    w.insts[1].release(token, None).unwrap();
    w.pump();
    let timing: Vec<_> = w
        .coord_events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::Delivered { timing, .. } => Some(*timing),
            _ => None,
        })
        .collect();
    let expected = LegTiming {
        queued: Duration::ZERO,
        written: Duration::from_millis(3),
        consumed: Duration::from_millis(2),
    };
    assert_eq!(timing, [expected]);
    assert_eq!(expected.to_ready(), Duration::from_millis(3));
    w.assert_clean();
}

#[test]
fn slow_path_allocates_a_slot() {
    world!(w, 8);
    w.stage(0, "big", 20 * KIB);
    assert_eq!(
        (
            w.sent(MsgType::Alloc),
            w.sent(MsgType::Allocated),
            w.sent(MsgType::Push)
        ),
        (1, 1, 1)
    );
    let [token] = w.received(1)[..] else { panic!() };
    assert_eq!(w.insts[1].received(token).unwrap().slot_size, 32 * KIB);
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    w.assert_clean();
}

#[test]
fn a_retryable_reject_is_retried_after_backoff() {
    world!(w, 8);
    // The receiver's pool (64 KiB, 16 KiB in preallocated slots) is filled
    // by one 32 KiB transfer that the application holds.
    w.stage(0, "hold", 32 * KIB);
    let [held] = w.received(1)[..] else { panic!() };
    w.stage(0, "next", 32 * KIB);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    assert!(w.failed().is_empty());
    w.insts[1].release(held, None).unwrap();
    w.pump();
    w.advance(2);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    assert_eq!(w.sent(MsgType::Alloc), 3);
    let [_, token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 2);
    // "next" waited in the queue from its staging at 0 until the retry
    // after the 1 ms backoff, which the clock reached at once.
    let queued: Vec<_> = w
        .coord_events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::Delivered { id, timing, .. } => Some((id.as_str(), timing.queued)),
            _ => None,
        })
        .collect();
    assert_eq!(
        queued,
        [("hold", Duration::ZERO), ("next", Duration::from_millis(1))]
    );
    w.assert_clean();
}

#[test]
fn rejects_past_the_attempt_limit_fail_the_request() {
    world!(w, 8);
    w.stage(0, "hold", 32 * KIB);
    let [held] = w.received(1)[..] else { panic!() };
    w.stage(0, "doomed", 32 * KIB);
    // Attempts at 0, 1 and 3 ms (backoff 1 ms times the attempt number).
    w.advance(5);
    assert_eq!(w.sent(MsgType::AllocReject), 3);
    assert_eq!(w.failed(), vec![FailReason::Rejected]);
    assert_eq!(w.sent(MsgType::Abort), 2, "sender and receiver told");
    w.insts[1].release(held, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    w.advance(10);
    w.assert_clean();
}

#[test]
fn a_size_no_pool_can_hold_is_rejected_for_good() {
    // Staged from a larger pool than the receiver's: not retryable.
    let big_pool = BuddyConfig {
        pool_size: 256 * KIB,
        ..POOL
    };
    let insts = vec![
        instance_with("encoder", "enc-0", "tcp://enc:1", big_pool, None),
        instance("denoiser", "den-0", "tcp://den:1"),
    ];
    let mut w = World::new(coordinator(8), insts);
    w.stage(0, "r", 128 * KIB);
    assert_eq!(w.failed(), vec![FailReason::Rejected]);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    w.advance(10);
    w.assert_clean();
}

#[test]
fn a_failed_write_fails_the_request() {
    world!(w, 8);
    w.writes = Some(Err("remote access error"));
    w.stage(0, "r", 20 * KIB);
    assert_eq!(w.failed(), vec![FailReason::WriteFailed]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "r" && reason.as_str() == "remote access error")));
    // The receiver's reserved slot sits out its quarantine, then frees.
    assert_eq!(w.insts[1].requests_held(), 1);
    w.advance(10);
    w.assert_clean();
}

#[test]
fn queue_timeout_without_receivers() {
    let mut w = World::new(
        coordinator(8),
        vec![instance("encoder", "enc-0", "tcp://enc:1")],
    );
    w.stage(0, "lonely", KIB);
    w.advance(99);
    assert!(w.failed().is_empty());
    w.advance(2);
    assert_eq!(w.failed(), vec![FailReason::QueueTimeout]);
    assert_eq!(
        w.insts[0].requests_held(),
        0,
        "the abort freed the staged slot"
    );
}

#[test]
fn alloc_timeout() {
    world!(w, 8);
    w.drop = vec![MsgType::Allocated];
    w.stage(0, "r", 20 * KIB);
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::AllocTimeout]);
    w.advance(10);
    w.assert_clean();
}

#[test]
fn push_timeout_and_the_late_completion() {
    world!(w, 8);
    w.writes = None;
    w.stage(0, "r", 6 * KIB);
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::PushTimeout]);
    // The write completes after the abort: no report, slot freed.
    let (i, write) = w.pending.pop().unwrap();
    w.insts[i]
        .handle_completion(w.now, write.token, Ok(()))
        .unwrap();
    w.pump();
    assert_eq!(w.sent(MsgType::Pushed), 0);
    // The preallocated slot comes back after its quarantine.
    assert_eq!(w.coord.prealloc_taken(), 1);
    w.advance(10);
    w.assert_clean();
}

#[test]
fn done_timeout_then_the_late_release() {
    world!(w, 8);
    w.stage(0, "r", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::DoneTimeout]);
    assert!(w.inst_events.contains(&(1, InstanceEvent::Aborted(token))));
    // The application still reads; the preallocated slot stays parked.
    assert!(w.insts[1].received(token).is_some());
    assert_eq!(w.coord.prealloc_taken(), 1);
    w.insts[1].release(token, None).unwrap();
    w.pump();
    // The late transfer_done gives the slot back at once.
    assert_eq!(w.coord.prealloc_taken(), 0);
    w.assert_clean();
}

/// The `error` of the one message of type `ty` an instance sent,
/// unescaped.
fn error_sent(w: &World<'_>, ty: &str) -> String {
    let texts: Vec<_> = w
        .from_instances
        .iter()
        .filter(|t| t.contains(&format!(r#""msg_type":"{ty}""#)))
        .collect();
    let [text] = texts[..] else {
        panic!("{texts:?}")
    };
    let error = match decode(text.as_bytes()).unwrap() {
        Msg::Pushed(p) => p.error,
        Msg::Done(d) => d.error,
        other => panic!("{other:?}"),
    };
    let mut buf = [0u8; 1024];
    error.unwrap().unescape_into(&mut buf).unwrap().to_owned()
}

#[test]
fn failure_texts_reach_the_wire_cut_at_a_character_boundary() {
    world!(w, 8);
    // A data plane's own error text, longer than a reason holds, with a
    // two-byte character straddling the limit.
    let long = format!(
        "peer gone: fi_writemsg (peer den-0): {} (errno 111)",
        "é".repeat(REASON_LEN)
    );
    w.writes = Some(Err(Box::leak(long.clone().into_boxed_str())));
    w.stage(0, "r", 6 * KIB);
    let pushed = error_sent(&w, "transfer_pushed");
    assert!(long.starts_with(&pushed), "{pushed}");
    assert!(pushed.len() == REASON_LEN || pushed.len() == REASON_LEN - 1);
    assert_eq!(w.failed(), vec![FailReason::WriteFailed]);
    w.advance(10);
    // The application's reason for failing a received transfer.
    w.writes = Some(Ok(()));
    w.stage(0, "r2", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    w.insts[1]
        .release(token, Some("decode failed: \"latents\" holds NaN\n"))
        .unwrap();
    w.pump();
    assert_eq!(
        error_sent(&w, "transfer_done"),
        "decode failed: \"latents\" holds NaN\n"
    );
    w.assert_clean();
}

#[test]
fn receiver_error_in_done_fails_the_request() {
    world!(w, 8);
    w.stage(0, "r", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    w.insts[1].release(token, Some("decode failed")).unwrap();
    w.pump();
    assert_eq!(w.failed(), vec![FailReason::ReceiverError]);
    w.assert_clean();
}

#[test]
fn re_registration_fails_in_flight_transfers() {
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
    ];
    let mut w = World::new(coordinator(8), insts);
    w.writes = None;
    w.stage(0, "r", 20 * KIB);
    // The denoiser restarts with a new session on the same endpoint.
    w.insts[1] = instance("denoiser", "den-1", "tcp://den:1");
    w.pump();
    assert_eq!(w.failed(), vec![FailReason::PeerGone]);
    assert!(w.coord_events.contains(&CoordinatorEvent::Registered {
        peer: PeerId(2),
        role: 1,
        replaced: true
    }));
    let (i, write) = w.pending.pop().unwrap();
    w.insts[i]
        .handle_completion(w.now, write.token, Err("peer gone"))
        .unwrap();
    w.writes = Some(Ok(()));
    // New work flows to the new session.
    w.stage(0, "r2", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    w.assert_clean();
}

#[test]
fn duplicates_and_strangers_change_nothing() {
    world!(w, 8);
    let mut buf = vec![0u8; 4096];
    // A duplicated transfer_staged.
    w.stage(0, "r", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    let staged =
        br#"{"msg_type":"transfer_staged","request_id":"r","data_size":6144,"session_id":"enc-0"}"#;
    assert_eq!(
        w.coord.handle(w.now, PeerId(1), &decode(staged).unwrap()),
        Err(Ignored::Duplicate)
    );
    // transfer_pushed twice.
    let pushed = decode(br#"{"msg_type":"transfer_pushed","request_id":"r"}"#).unwrap();
    assert_eq!(
        w.coord.handle(w.now, PeerId(1), &pushed),
        Err(Ignored::WrongState)
    );
    // From a stranger, or from the wrong instance.
    assert_eq!(
        w.coord.handle(w.now, PeerId(9), &decode(staged).unwrap()),
        Err(Ignored::NotRegistered)
    );
    let done = decode(br#"{"msg_type":"transfer_done","request_id":"r"}"#).unwrap();
    assert_eq!(
        w.coord.handle(w.now, PeerId(1), &done),
        Err(Ignored::WrongPeer)
    );
    // transfer_ready for a slot that is not this request's.
    let ready =
        decode(br#"{"msg_type":"transfer_ready","request_id":"x","slot_offset":12345}"#).unwrap();
    assert_eq!(
        w.insts[1].handle(w.now, &ready),
        Err(Ignored::UnknownRequest)
    );
    // transfer_ready twice.
    let again =
        decode(br#"{"msg_type":"transfer_ready","request_id":"r","slot_offset":0}"#).unwrap();
    assert_eq!(w.insts[1].handle(w.now, &again), Err(Ignored::Duplicate));
    assert!(w.coord.poll_transmit(&mut buf).is_none());
    w.insts[1].release(token, None).unwrap();
    assert_eq!(
        w.insts[1].release(token, None),
        Err(InstanceError::StaleToken)
    );
    w.pump();
    // Late messages about a finished request.
    assert_eq!(
        w.coord.handle(w.now, PeerId(2), &done),
        Err(Ignored::UnknownRequest)
    );
    assert_eq!(
        w.coord.handle(w.now, PeerId(1), &decode(staged).unwrap()),
        Err(Ignored::Duplicate)
    );
    assert_eq!(w.delivered(), 1);
    w.assert_clean();
}

#[test]
fn late_messages_after_an_abort_are_ignored() {
    world!(w, 8);
    w.drop = vec![MsgType::Allocated];
    w.stage(0, "r", 20 * KIB);
    w.advance(11);
    let late_ready =
        decode(br#"{"msg_type":"transfer_ready","request_id":"r","slot_offset":0}"#).unwrap();
    assert_eq!(w.insts[1].handle(w.now, &late_ready), Err(Ignored::Aborted));
    let late_push =
        decode(br#"{"msg_type":"transfer_push","request_id":"r","transfer_size":20480}"#).unwrap();
    assert_eq!(w.insts[0].handle(w.now, &late_push), Err(Ignored::Aborted));
}

#[test]
fn a_full_transfer_table_is_answered_on_the_wire() {
    world!(w, 1);
    w.writes = None;
    w.stage(0, "a", 6 * KIB);
    w.stage(0, "b", 6 * KIB);
    assert_eq!(w.failed(), vec![FailReason::TableFull]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "b" && reason.as_str() == FailReason::TableFull.as_str())));
    assert_eq!(w.insts[0].requests_held(), 1, "only 'a' is still staged");
}

#[test]
fn unknown_roles_and_bad_slots_are_refused_at_registration() {
    let mut w = World::new(
        coordinator(8),
        vec![instance("painter", "p-0", "tcp://p:1")],
    );
    assert!(!w.insts[0].is_registered());
    assert!(w.inst_events.contains(&(0, InstanceEvent::Refused)));
    let reg = br#"{"msg_type":"transfer_register","role":"denoiser","session_id":"d","pool_ptr":4096,"pool_size":8192,"work_endpoint":"tcp://d:1","preallocated_slots":[{"offset":4096,"size":8192,"slot_id":0,"addr":8192}]}"#;
    assert_eq!(
        w.coord.handle(w.now, PeerId(5), &decode(reg).unwrap()),
        Ok(())
    );
    let mut buf = vec![0u8; 1024];
    let t = w.coord.poll_transmit(&mut buf).unwrap().unwrap();
    let Msg::RegisterAck(ack) = decode(&buf[..t.len]).unwrap() else {
        panic!()
    };
    assert!(!ack.accepted);
    assert_eq!(ack.error.unwrap(), "bad preallocated_slots");
    assert_eq!(w.coord.members(), 0);
}

#[test]
fn a_ready_the_receiver_cannot_take_is_answered_and_its_duplicate_ignored() {
    world!(w, 8);
    // A transfer_ready whose manifest reaches past its (preallocated) slot.
    let ready = br#"{"msg_type":"transfer_ready","request_id":"odd","manifest":{"x":[{"offset":0,"shape":[65536],"dtype":"uint8"}]},"slot_offset":0}"#;
    let msg = decode(ready).unwrap();
    assert_eq!(w.insts[1].handle(w.now, &msg), Ok(()));
    let mut buf = vec![0u8; 1024];
    let n = w.insts[1].poll_transmit(&mut buf).unwrap().unwrap();
    let Msg::Done(done) = decode(&buf[..n]).unwrap() else {
        panic!()
    };
    assert_eq!(done.error.unwrap(), "manifest does not fit the slot");
    // The same message again (duplicated by the network) changes nothing.
    assert_eq!(w.insts[1].handle(w.now, &msg), Err(Ignored::Aborted));
    assert!(w.insts[1].poll_transmit(&mut buf).is_none());
    assert_eq!(w.insts[1].prealloc_in_use(), 0);
}

#[test]
fn one_request_id_passes_through_every_leg() {
    const THREE: [&str; 3] = ["encoder", "denoiser", "decoder"];
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
        instance("decoder", "dec-0", "tcp://dec:1"),
    ];
    let mut w = World::new(coordinator_for(8, &THREE), insts);
    w.stage(0, "r1", 6 * KIB);
    let [input] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    // The denoiser forwards the request under the same id while it still
    // holds its input; the second leg's write is slow.
    w.advance(6);
    w.writes = None;
    w.stage(1, "r1", 6 * KIB);
    assert_eq!(w.pending.len(), 1);
    // The first leg times out waiting for the denoiser's `transfer_done`.
    w.advance(5);
    let failed: Vec<_> = w
        .coord_events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::Failed { id, leg, reason } => Some((id.as_str(), *leg, *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [("r1", 0, FailReason::DoneTimeout)]);
    // Its abort took the denoiser's receiving side only: the write of the
    // second leg goes on.
    assert!(w.inst_events.contains(&(1, InstanceEvent::Aborted(input))));
    assert!(!w
        .inst_events
        .iter()
        .any(|(i, e)| *i == 1 && matches!(e, InstanceEvent::SendFailed { .. })));
    let (i, write) = w.pending.pop().unwrap();
    w.insts[i]
        .handle_completion(w.now, write.token, Ok(()))
        .unwrap();
    w.pump();
    let [output] = w.received(2)[..] else {
        panic!("{:?}", w.inst_events)
    };
    assert_eq!(w.insts[2].received(output).unwrap().id, "r1");
    w.insts[2].release(output, None).unwrap();
    w.insts[1].release(input, None).unwrap();
    w.pump();
    let delivered: Vec<_> = w
        .coord_events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::Delivered { id, leg, .. } => Some((id.as_str(), *leg)),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, [("r1", 1)]);
    w.advance(100);
    w.assert_clean();
}

#[test]
fn losing_the_coordinator_ends_what_it_relayed() {
    world!(w, 8);
    // Pushes never arrive: one request waits on the slow path with a slot
    // reserved at the receiver, one on the fast path, one in the queue.
    w.drop = vec![MsgType::Push];
    w.stage(0, "c", 20 * KIB);
    w.stage(0, "a", 6 * KIB);
    w.stage(0, "b", 6 * KIB);
    assert_eq!(w.insts[1].requests_held(), 1);
    // Both instances lose the coordinator and register again.
    let now = w.now;
    for inst in &mut w.insts {
        inst.reregister(now);
    }
    let failed: Vec<_> = w
        .insts
        .iter_mut()
        .flat_map(|i| std::iter::from_fn(|| i.poll_event()))
        .collect();
    assert_eq!(
        failed
            .iter()
            .filter(|e| matches!(e, InstanceEvent::SendFailed { .. }))
            .count(),
        3,
        "{failed:?}"
    );
    // The sender's slots are free at once; the receiver's reserved slot
    // only after its quarantine.
    assert_eq!(w.insts[0].requests_held(), 0);
    assert_eq!(w.insts[1].requests_held(), 1);
    w.drop.clear();
    w.pump();
    assert!(w.insts.iter().all(Instance::is_registered));
    // The coordinator's own timers end its side; then all is clean, and a
    // new request goes through.
    w.advance(200);
    w.assert_clean();
    w.stage(0, "after", 6 * KIB);
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    w.assert_clean();
}

/// An encoder, and a denoiser whose data plane reports arrivals (its
/// completions do not mean delivery): transfers wait for their write to
/// land, at most `$landing` ms.
macro_rules! gated_world {
    ($w:ident, $landing:expr) => {
        let insts = vec![
            instance("encoder", "enc-0", "tcp://enc:1"),
            instance_with(
                "denoiser",
                "den-0",
                "tcp://den:1",
                POOL,
                Some(Duration::from_millis($landing)),
            ),
        ];
        let mut $w = World::new(coordinator(8), insts);
        assert!($w.insts.iter().all(Instance::is_registered));
    };
}

/// The tag of the write the receiver's one waiting transfer, `id`, waits
/// for: its request id and the address of its slot.
fn awaited(w: &World<'_>, id: &str) -> WriteTag {
    assert_eq!(w.insts[1].awaiting_landing(), 1);
    let (offset, _) = w.insts[1].slot_for(id).unwrap();
    WriteTag::of(id, POOL_PTR + offset)
}

#[test]
fn a_gated_receiver_hands_over_a_transfer_only_once_its_write_landed() {
    gated_world!(w, 3);
    w.writes = None;
    // The fast path (a preallocated slot), then the slow one (too large
    // for those).
    for (n, (id, size)) in [("fast", 6 * KIB), ("slow", 20 * KIB)]
        .into_iter()
        .enumerate()
    {
        w.stage(0, id, size);
        let (i, write) = w.pending.pop().unwrap();
        w.insts[i]
            .handle_completion(w.now, write.token, Ok(()))
            .unwrap();
        w.pump();
        assert_eq!(w.received(1).len(), n, "announced ready, not yet landed");
        // The receiver waits for the tag the sender wrote with.
        let tag = awaited(&w, id);
        assert_eq!(tag, write.tag);
        assert_eq!(tag, WriteTag::of(id, write.dest_addr));
        // Another write's arrival hands nothing over.
        assert!(!w.insts[1].handle_landed(w.now, Landed::of(WriteTag(tag.0 ^ 1))));
        w.pump();
        assert_eq!(w.received(1).len(), n);
        // The write's, named by as few bits as a narrow notice carries.
        assert!(w.insts[1].handle_landed(w.now, Landed::low_bits(tag.0, 20)));
        w.pump();
        assert_eq!(w.received(1).len(), n + 1);
        // A second notice for it is not a second delivery.
        assert!(!w.insts[1].handle_landed(w.now, Landed::of(tag)));
        w.pump();
        assert_eq!(w.received(1).len(), n + 1);
    }
    assert_eq!(w.sent(MsgType::Alloc), 1);
    for token in w.received(1) {
        w.insts[1].release(token, None).unwrap();
    }
    w.pump();
    assert_eq!(w.delivered(), 2);
    assert_eq!(w.insts[1].stats().received, 2);
    w.assert_clean();
}

/// The bytes do not travel through the coordinator, the ready does: a
/// write reported landed before its `transfer_ready` came is remembered,
/// and the transfer is handed over as soon as the ready comes.
#[test]
fn a_write_that_landed_before_its_ready_is_handed_over_when_the_ready_comes() {
    gated_world!(w, 3);
    w.writes = None;
    w.stage(0, "early", 6 * KIB);
    let (i, write) = w.pending.pop().unwrap();
    assert!(!w.insts[1].handle_landed(w.now, Landed::of(write.tag)));
    assert_eq!(w.insts[1].awaiting_landing(), 0, "no ready yet");
    w.insts[i]
        .handle_completion(w.now, write.token, Ok(()))
        .unwrap();
    w.pump();
    let [token] = w.received(1)[..] else {
        panic!("handed over with the ready: {:?}", w.received(1))
    };
    assert_eq!(w.insts[1].awaiting_landing(), 0);
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    w.assert_clean();
}

/// A remembered arrival is forgotten after the landing limit: a ready that
/// late is not taken for those bytes, and waits (then fails) as any other.
#[test]
fn an_arrival_no_ready_claims_is_forgotten_after_the_landing_limit() {
    gated_world!(w, 3);
    w.writes = None;
    w.stage(0, "stale", 6 * KIB);
    let (i, write) = w.pending.pop().unwrap();
    assert!(!w.insts[1].handle_landed(w.now, Landed::of(write.tag)));
    w.now = w.now + Duration::from_millis(3);
    w.insts[i]
        .handle_completion(w.now, write.token, Ok(()))
        .unwrap();
    w.pump();
    assert!(w.received(1).is_empty(), "the arrival was forgotten");
    assert_eq!(w.insts[1].awaiting_landing(), 1);
    w.advance(3 + 5);
    assert_eq!(error_sent(&w, "transfer_done"), "write never landed");
    assert!(w.received(1).is_empty());
    w.assert_clean();
}

#[test]
fn a_write_that_never_lands_is_refused_after_its_slot_sat_out_a_quarantine() {
    gated_world!(w, 3);
    w.stage(0, "lost", 6 * KIB);
    let tag = awaited(&w, "lost");
    let (offset, _) = w.insts[1].slot_for("lost").unwrap();
    // The landing limit passes: nothing is handed over, nothing reported
    // yet, and the slot stays held (the bytes may still come).
    w.advance(3);
    assert!(w.received(1).is_empty());
    assert_eq!(w.sent(MsgType::Done), 0);
    assert_eq!(w.insts[1].slot_for("lost").map(|s| s.0), Some(offset));
    assert_eq!(w.insts[1].stats().never_landed, 1);
    assert_eq!(w.insts[1].prealloc_in_use(), 1);
    assert_eq!(w.coord.prealloc_taken(), 1);
    // A notice after the limit hands nothing over.
    assert!(!w.insts[1].handle_landed(w.now, Landed::of(tag)));
    // The quarantine ends: the slot is free, and only now does the
    // coordinator hear of the failure (and may reuse the slot).
    w.advance(5);
    assert_eq!(error_sent(&w, "transfer_done"), "write never landed");
    assert_eq!(w.failed(), vec![FailReason::ReceiverError]);
    assert!(w.received(1).is_empty());
    w.assert_clean();
}

#[test]
fn an_abort_while_landing_quarantines_the_slot_and_reports_when_it_is_free() {
    // The receiver's gate (20 ms) outlasts the coordinator's done timeout
    // (10 ms): the coordinator aborts first.
    gated_world!(w, 20);
    w.stage(0, "r", 6 * KIB);
    let _ = awaited(&w, "r");
    w.advance(10);
    assert_eq!(w.failed(), vec![FailReason::DoneTimeout]);
    assert_eq!(w.insts[1].awaiting_landing(), 0);
    assert!(w.insts[1].slot_for("r").is_some(), "quarantined, not freed");
    assert_eq!(
        w.coord.prealloc_taken(),
        1,
        "parked until the receiver lets go"
    );
    w.advance(5);
    assert_eq!(error_sent(&w, "transfer_done"), "write never landed");
    assert!(w.received(1).is_empty());
    w.assert_clean();
}

#[test]
fn write_cookies_are_tokens_and_a_stale_one_is_refused() {
    world!(w, 8);
    w.writes = None;
    w.stage(0, "r", 6 * KIB);
    let (i, write) = w.pending.pop().unwrap();
    let token = Token::from_cookie(write.token.cookie());
    assert_eq!(token, write.token);
    assert_eq!(
        w.insts[i].handle_completion(w.now, token, Ok(())),
        Ok(6 * KIB)
    );
    // The same cookie again (a duplicated completion) names nothing now.
    assert_eq!(
        w.insts[i].handle_completion(w.now, Token::from_cookie(write.token.cookie()), Ok(())),
        Err(Ignored::UnknownRequest)
    );
    // Nor does one no write was posted with.
    assert!(w.insts[i]
        .handle_completion(w.now, Token::from_cookie(u64::MAX), Ok(()))
        .is_err());
    w.pump();
    let [token] = w.received(1)[..] else { panic!() };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    w.assert_clean();
}

#[test]
fn losing_the_coordinator_reregisters_only_an_answered_registration() {
    let mut inst = instance("encoder", "enc-0", "tcp://enc:1");
    let mut buf = vec![0u8; 4096];
    assert_eq!(inst.registration(), Registration::Pending);
    let n = inst.poll_transmit(&mut buf).unwrap().unwrap();
    assert!(buf[..n].starts_with(br#"{"msg_type":"transfer_register""#));
    // Still registering: the lost coordinator knew nothing, nothing
    // changes (the staged request waits for whoever answers).
    let (token, _) = inst.stage("r", 6 * KIB).unwrap();
    inst.commit(
        Instant(0),
        token,
        6 * KIB,
        &Manifest::Entries(&[]),
        RawJson::EMPTY_OBJECT,
    )
    .unwrap();
    inst.handle_coordinator_lost(Instant(1));
    assert_eq!(inst.registration(), Registration::Pending);
    assert_eq!(inst.requests_held(), 1);
    // Refused, then lost: it registers anew.
    let refused = decode(br#"{"msg_type":"transfer_register_ack","session_id":"enc-0","accepted":false,"error":"unknown role"}"#).unwrap();
    inst.handle(Instant(2), &refused).unwrap();
    assert_eq!(inst.registration(), Registration::Refused);
    assert_eq!(inst.refusal(), "unknown role");
    inst.handle_coordinator_lost(Instant(3));
    assert_eq!(inst.registration(), Registration::Pending);
    // Accepted, then lost: what it relayed ends, and it registers anew.
    let accepted =
        decode(br#"{"msg_type":"transfer_register_ack","session_id":"enc-0","accepted":true}"#)
            .unwrap();
    inst.handle(Instant(4), &accepted).unwrap();
    assert_eq!(inst.registration(), Registration::Accepted);
    while inst.poll_transmit(&mut buf).is_some() {}
    inst.handle_coordinator_lost(Instant(5));
    assert_eq!(inst.registration(), Registration::Pending);
    assert_eq!(inst.requests_held(), 0, "the staged request failed");
    let n = inst.poll_transmit(&mut buf).unwrap().unwrap();
    assert!(buf[..n].starts_with(br#"{"msg_type":"transfer_register""#));
}

#[test]
fn a_gated_receiver_holds_a_slot_it_refuses_until_late_bytes_could_have_come() {
    gated_world!(w, 3);
    // A manifest larger than its slot: the receiver must refuse it, but on
    // a data plane whose completions do not mean delivery the bytes may
    // still be on their way into the preallocated slot.
    let (token, _) = w.insts[0].stage("big", 6 * KIB).unwrap();
    let dims = [64 * KIB];
    let entries = [blob(&dims)];
    w.insts[0]
        .commit(
            w.now,
            token,
            6 * KIB,
            &Manifest::Entries(&entries),
            RawJson::EMPTY_OBJECT,
        )
        .unwrap();
    w.pump();
    assert_eq!(w.sent(MsgType::Ready), 1);
    // Refused, but not yet reported: the slot stays out of use.
    assert_eq!(w.sent(MsgType::Done), 0);
    assert_eq!(w.insts[1].prealloc_in_use(), 1);
    assert_eq!(w.coord.prealloc_taken(), 1);
    // Once the landing limit and a quarantine have passed, the refusal goes
    // out and the coordinator may reuse the slot.
    w.advance(7);
    assert_eq!(w.sent(MsgType::Done), 0);
    w.advance(1);
    assert_eq!(
        error_sent(&w, "transfer_done"),
        "manifest does not fit the slot"
    );
    assert_eq!(w.failed(), vec![FailReason::ReceiverError]);
    w.assert_clean();
}

// ---- sglang's head and its flow -------------------------------------------

/// An instance configured for sglang's head (holds an ALLOC 50 ms).
fn sglang_instance(role: &'static str, session: &'static str) -> Instance<'static> {
    sglang_instance_at(role, session, "tcp://sg:1")
}

fn sglang_instance_at(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
) -> Instance<'static> {
    instance_under(Head::Sglang, role, session, endpoint, POOL, None)
}

/// Every message `inst` has to send now, as text.
fn outbox(inst: &mut Instance<'_>) -> Vec<String> {
    let mut buf = vec![0u8; 16 * 1024];
    harness::instance_outbox(inst, &mut buf)
        .into_iter()
        .map(|m| String::from_utf8(m).unwrap())
        .collect()
}

fn feed(inst: &mut Instance<'_>, now_ms: u64, json: &str) -> Result<(), Ignored> {
    inst.handle(Instant(now_ms * MS), &decode(json.as_bytes()).unwrap())
}

/// A denoiser (serving under `head`) between a ferry encoder and decoder,
/// around a ferry coordinator: `r1` is delivered to the denoiser, which
/// forwards it. Returns the world and where the forward's messages start.
fn forward_world(head: Head) -> (World<'static>, usize) {
    forward_world_with(head, |_| {})
}

/// [`forward_world`], with `before_forward` run once `r1` is delivered.
fn forward_world_with(
    head: Head,
    before_forward: impl FnOnce(&mut World<'static>),
) -> (World<'static>, usize) {
    let denoiser = match head {
        Head::Ferry => instance("denoiser", "den-0", "tcp://den:1"),
        Head::Sglang => sglang_instance_at("denoiser", "den-0", "tcp://den:1"),
    };
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        denoiser,
        instance("decoder", "dec-0", "tcp://dec:1"),
    ];
    let pipeline = ["encoder", "denoiser", "decoder"];
    let mut w = World::new(coordinator_for(8, &pipeline), insts);
    w.stage(0, "r1", 6 * KIB);
    let [rx] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    before_forward(&mut w);
    // The denoiser stages its output under the same id and forwards.
    let (next, _) = w.insts[1].stage("r1", 4 * KIB).unwrap();
    let dims = [4 * KIB];
    let entries = [TensorEntry {
        field: "latents".into(),
        ..blob(&dims)
    }];
    let before = w.from_instances.len();
    let scalars = RawJson::parse_object(r#"{"step":2}"#).unwrap();
    let manifest = Manifest::Entries(&entries);
    w.insts[1]
        .forward(w.now, rx, next, 4 * KIB, &manifest, scalars)
        .unwrap();
    assert_eq!(w.insts[1].received(rx).map(|r| r.id), None, "released");
    w.pump();
    (w, before)
}

/// What a forward leads to under either head: the decoder receives the
/// next leg, the fast path's ready named the preallocated slot as sglang's
/// head does (and the receiver took the key out), and everything ends clean.
fn forward_completes(mut w: World<'_>) {
    let [dec] = w.received(2)[..] else {
        panic!("{:?}", w.inst_events)
    };
    let got = w.insts[2].received(dec).unwrap();
    assert_eq!(got.id, "r1");
    assert_eq!(got.scalar_fields.as_str(), r#"{"step":2}"#);
    let ready = w
        .from_coordinator
        .iter()
        .rfind(|m| m.contains(r#""msg_type":"transfer_ready""#))
        .unwrap();
    assert!(
        ready.contains(r#""scalar_fields":{"step":2,"_prealloc_slot_id":0}"#),
        "{ready}"
    );
    w.insts[2].release(dec, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 2);
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    w.assert_clean();
}

#[test]
fn under_sglangs_head_a_forward_is_one_message_and_ferrys_coordinator_takes_it() {
    let (w, before) = forward_world(Head::Sglang);
    let sent = &w.from_instances[before..];
    assert!(
        sent[0].starts_with(
            r#"{"msg_type":"transfer_done","request_id":"r1","staged_for_decoder":true,"session_id":"den-0","#
        ),
        "{sent:?}"
    );
    assert!(
        !sent.iter().any(|m| m.contains("transfer_staged")),
        "{sent:?}"
    );
    assert_eq!(w.coord.stats().forwarded, 1);
    forward_completes(w);
}

#[test]
fn under_ferrys_coordinator_a_forward_is_staged_then_done_as_since_the_seed() {
    let (w, before) = forward_world(Head::Ferry);
    let sent: Vec<&str> = w.from_instances[before..]
        .iter()
        .map(|m| &m[..m.find(r#","request_id""#).unwrap_or(m.len())])
        .collect();
    assert_eq!(
        sent[..2],
        [
            r#"{"msg_type":"transfer_staged""#,
            r#"{"msg_type":"transfer_done""#
        ]
    );
    assert_eq!(w.coord.stats().forwarded, 0);
    forward_completes(w);
}

#[test]
fn a_forward_needs_the_same_request_and_a_held_delivery() {
    let mut inst = sglang_instance("denoiser", "den-0");
    outbox(&mut inst);
    let ready = r#"{"msg_type":"transfer_ready","request_id":"a","manifest":{},"slot_offset":0,"scalar_fields":{}}"#;
    feed(&mut inst, 0, ready).unwrap();
    let Some(InstanceEvent::Received(rx)) =
        std::iter::from_fn(|| inst.poll_event()).find(|e| matches!(e, InstanceEvent::Received(_)))
    else {
        panic!()
    };
    let (other, _) = inst.stage("b", KIB).unwrap();
    let m = Manifest::default();
    let none = RawJson::EMPTY_OBJECT;
    assert_eq!(
        inst.forward(Instant(0), rx, other, KIB, &m, none),
        Err(InstanceError::BadId)
    );
    assert_eq!(
        inst.forward(Instant(0), other, other, KIB, &m, none),
        Err(InstanceError::StaleToken)
    );
    assert!(inst.received(rx).is_some(), "nothing changed");
    assert!(outbox(&mut inst).is_empty());
}

#[test]
fn under_sglangs_head_an_instance_registers_once_and_is_usable_when_it_is_sent() {
    let mut inst = sglang_instance("encoder", "enc-0");
    assert_eq!(inst.registration(), Registration::Pending);
    let first = outbox(&mut inst);
    assert_eq!(first.len(), 1);
    assert!(first[0].starts_with(r#"{"msg_type":"transfer_register""#));
    assert_eq!(inst.registration(), Registration::Sent);
    assert!(inst.is_registered());
    // No answer ever comes, and none is waited for: no resend.
    for t in 1..100 {
        inst.handle_timeout(Instant(t * 10 * MS));
        assert!(outbox(&mut inst).is_empty());
    }
    // Staged requests go out at once, with sglang 0.5.23's scalar_fields.
    let (token, _) = inst.stage("r1", KIB).unwrap();
    inst.commit(
        Instant(MS),
        token,
        KIB,
        &Manifest::default(),
        RawJson::EMPTY_OBJECT,
    )
    .unwrap();
    let staged = outbox(&mut inst);
    assert!(
        staged[0].ends_with(r#""slot_offset":16384,"scalar_fields":{}}"#),
        "{staged:?}"
    );
    // A lost connection to the head: one registration again, not a flood.
    inst.handle_coordinator_lost(Instant(2 * MS));
    let again = outbox(&mut inst);
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].starts_with(r#"{"msg_type":"transfer_register""#));
    inst.handle_timeout(Instant(900 * MS));
    assert!(outbox(&mut inst).is_empty());
}

#[test]
fn under_sglangs_head_an_alloc_without_room_is_held_until_room_frees_or_the_hold_ends() {
    let mut inst = sglang_instance("denoiser", "den-0");
    outbox(&mut inst);
    let alloc = |id: &str| {
        format!(
            r#"{{"msg_type":"transfer_alloc","request_id":"{id}","data_size":32768,"source_role":"encoder"}}"#
        )
    };
    feed(&mut inst, 0, &alloc("a")).unwrap();
    let out = outbox(&mut inst);
    assert!(out[0].starts_with(r#"{"msg_type":"transfer_allocated","request_id":"a""#));
    let Msg::Allocated(a) = decode(out[0].as_bytes()).unwrap() else {
        panic!()
    };
    // The pool (64 KiB, 16 KiB preallocated) has no room for a second
    // 32 KiB: no reject goes to a head that cannot read one.
    feed(&mut inst, 1, &alloc("b")).unwrap();
    assert!(outbox(&mut inst).is_empty());
    assert_eq!(inst.stats().allocs_held, 1);
    // `a` is delivered and released: sglang's head hears nothing of that
    // (the output or the forward tells it), and `b` gets the room.
    let ready = format!(
        r#"{{"msg_type":"transfer_ready","request_id":"a","manifest":{{}},"slot_offset":{},"scalar_fields":{{}}}}"#,
        a.slot_offset
    );
    feed(&mut inst, 2, &ready).unwrap();
    let rx = std::iter::from_fn(|| inst.poll_event())
        .find_map(|e| match e {
            InstanceEvent::Received(t) => Some(t),
            _ => None,
        })
        .unwrap();
    inst.release(rx, None).unwrap();
    let out = outbox(&mut inst);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with(r#"{"msg_type":"transfer_allocated","request_id":"b""#),
        "{out:?}"
    );
    // `c` finds no room either, and none comes: at the hold's end the head
    // is told, in a message it reads, that the request failed.
    feed(&mut inst, 3, &alloc("c")).unwrap();
    assert!(outbox(&mut inst).is_empty());
    inst.handle_timeout(Instant(40 * MS));
    assert!(outbox(&mut inst).is_empty());
    inst.handle_timeout(Instant(60 * MS));
    let out = outbox(&mut inst);
    assert_eq!(
        out,
        vec![
            r#"{"msg_type":"transfer_done","request_id":"c","error":"no room in the pool in time"}"#
        ]
    );
}

#[test]
fn under_sglangs_head_a_failed_write_is_not_announced_as_pushed() {
    let mut inst = sglang_instance("encoder", "enc-0");
    outbox(&mut inst);
    let (token, _) = inst.stage("r1", KIB).unwrap();
    inst.commit(
        Instant(0),
        token,
        KIB,
        &Manifest::default(),
        RawJson::EMPTY_OBJECT,
    )
    .unwrap();
    outbox(&mut inst);
    let push = r#"{"msg_type":"transfer_push","request_id":"r1","dest_session_id":"d","dest_addr":4096,"transfer_size":1024}"#;
    feed(&mut inst, 1, push).unwrap();
    let w = inst.poll_action().unwrap();
    inst.handle_completion(Instant(2 * MS), w.token, Err("peer gone"))
        .unwrap();
    // That head would announce the unwritten slot ready; it fails the
    // request at its timeout instead.
    assert!(outbox(&mut inst).is_empty());
    assert!(std::iter::from_fn(|| inst.poll_event())
        .any(|e| matches!(e, InstanceEvent::SendFailed { id, .. } if id.as_str() == "r1")));
    assert_eq!(inst.requests_held(), 0);
}

#[test]
fn every_fail_reason_has_its_place_and_a_distinct_label() {
    let mut codes = std::collections::HashSet::new();
    for (i, r) in FailReason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i, "{r:?}");
        assert!(codes.insert(r.code()), "{r:?}: {} twice", r.code());
        assert!(r
            .code()
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_'));
    }
}

#[test]
fn an_encoder_restarted_under_its_old_ids_is_told_the_ids_are_taken() {
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
    ];
    let mut w = World::new(coordinator(8), insts);
    w.stage(0, "r1", 6 * KIB);
    let [token] = w.received(1)[..] else { panic!() };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    // The encoder restarts (a new session at the same endpoint) and
    // stages the same id again: refused, and told why.
    w.insts[0] = instance("encoder", "enc-1", "tcp://enc:1");
    w.pump();
    w.stage(0, "r1", 6 * KIB);
    assert_eq!(w.failed(), vec![FailReason::IdReused]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "r1" && reason.as_str() == FailReason::IdReused.as_str())));
    // A fresh id goes through.
    w.stage(0, "r2", 6 * KIB);
    let [_, token] = w.received(1)[..] else {
        panic!()
    };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 2);
    w.assert_clean();
}

/// The ack the coordinator sends to a registration, if any.
fn answer_to(
    c: &mut Coordinator<'static>,
    peer: u32,
    reg: &[u8],
) -> (Result<(), Ignored>, Option<String>) {
    let r = c.handle(Instant(0), PeerId(peer), &decode(reg).unwrap());
    let mut buf = vec![0u8; 1024];
    let ack = c
        .poll_transmit(&mut buf)
        .map(|t| String::from_utf8(buf[..t.unwrap().len].to_vec()).unwrap());
    (r, ack)
}

fn refusals(c: &mut Coordinator<'static>) -> Vec<(&'static str, bool)> {
    std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            CoordinatorEvent::Refused { reason, acked, .. } => Some((reason, acked)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pool_whose_end_overflows_is_refused_with_the_reason() {
    let mut c = coordinator(8);
    let reg = br#"{"msg_type":"transfer_register","role":"denoiser","session_id":"d","pool_ptr":18446744073709547520,"pool_size":16777216,"work_endpoint":"tcp://d:1"}"#;
    let (r, ack) = answer_to(&mut c, 1, reg);
    assert_eq!(r, Ok(()));
    let ack = ack.expect("an answer");
    assert!(ack.contains(r#""accepted":false"#), "{ack}");
    assert!(ack.contains("overflows"), "{ack}");
    assert_eq!(c.members(), 0);
    assert_eq!(
        refusals(&mut c),
        [("pool_ptr + pool_size overflows 64 bits", true)]
    );
    // An unknown role is refused the same way, and said.
    let reg = br#"{"msg_type":"transfer_register","role":"overlord","session_id":"o","pool_ptr":4096,"pool_size":4096,"work_endpoint":"tcp://o:1"}"#;
    let (_, ack) = answer_to(&mut c, 2, reg);
    assert!(ack.unwrap().contains("unknown role"));
    assert_eq!(refusals(&mut c), [("unknown role", true)]);
    assert_eq!(c.stats().refused, 2);
}

#[test]
fn with_an_admission_list_only_its_endpoints_register_as_their_roles() {
    let mut c = coordinator(8);
    c.admit("denoiser", "tcp://d:1").unwrap();
    assert_eq!(
        c.admit("painter", "tcp://p:1"),
        Err(ConfigError::UnknownRole)
    );
    let reg = |role: &str, ep: &str| {
        format!(
            r#"{{"msg_type":"transfer_register","role":"{role}","session_id":"s-{ep}","pool_ptr":4096,"pool_size":65536,"work_endpoint":"{ep}"}}"#
        )
    };
    // A stranger: dropped unanswered, and said.
    let (r, ack) = answer_to(&mut c, 1, reg("denoiser", "tcp://ghost:1").as_bytes());
    assert_eq!((r, ack), (Err(Ignored::NotAdmitted), None));
    // An admitted endpoint under another role: the same.
    let (r, ack) = answer_to(&mut c, 2, reg("encoder", "tcp://d:1").as_bytes());
    assert_eq!((r, ack), (Err(Ignored::NotAdmitted), None));
    assert_eq!(
        refusals(&mut c),
        [
            ("the endpoint is not admitted for this role", false),
            ("the endpoint is not admitted for this role", false)
        ]
    );
    assert_eq!(c.members(), 0);
    // The admitted endpoint as its role.
    let (r, ack) = answer_to(&mut c, 3, reg("denoiser", "tcp://d:1").as_bytes());
    assert_eq!(r, Ok(()));
    assert!(ack.unwrap().contains(r#""accepted":true"#));
    assert_eq!(c.members(), 1);
}

#[test]
fn forged_allocs_cannot_take_the_room_of_the_preallocated_slots() {
    world!(w, 8);
    let mut buf = vec![0u8; 1024];
    let mut answers = Vec::new();
    // A flood of ALLOCs for ids nobody staged (8 request records, 2
    // preallocated slots: 6 may be reserved).
    for n in 0..20 {
        let alloc = format!(
            r#"{{"msg_type":"transfer_alloc","request_id":"forged-{n}","data_size":1024,"source_role":"encoder"}}"#
        );
        let _ = w.insts[1].handle(w.now, &decode(alloc.as_bytes()).unwrap());
        while let Some(r) = w.insts[1].poll_transmit(&mut buf) {
            answers.push(decode(&buf[..r.unwrap()]).unwrap().msg_type());
        }
    }
    let allocated = answers.iter().filter(|t| **t == MsgType::Allocated).count();
    let rejected = answers
        .iter()
        .filter(|t| **t == MsgType::AllocReject)
        .count();
    assert_eq!((allocated, rejected), (6, 14), "{answers:?}");
    // A real hand-off on the fast path still finds its place.
    w.stage(0, "real", 6 * KIB);
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
}

/// Under `MostFreeSlots`, data that no preallocated slot of the role fits
/// goes to the receiver with the most room, whatever free slots the others
/// have; data that fits goes where the most free slots are.
#[test]
fn most_free_slots_ranks_by_room_when_no_slot_fits_and_by_slots_when_they_do() {
    let config = CoordinatorConfig {
        policy: Policy::MostFreeSlots,
        capacity_per_instance: 4,
        ..paths::COORDINATOR
    };
    let coord = harness::coordinator(&PIPELINE, config, &LIMITS);
    // den-1 (and the encoder) offer no preallocated slot; den-0 two of
    // 8 KiB.
    let bare = |role, name, endpoint| {
        let who = InstanceIdentity {
            role,
            session_id: name,
            work_endpoint: endpoint,
            pool_ptr: POOL_PTR,
            pool_size: POOL.pool_size,
            delivery_complete: true,
        };
        let config = InstanceConfig {
            min_block: POOL.min_block,
            prealloc: Prealloc::NONE,
            register_retry: Duration::from_millis(5),
            staged_timeout: Duration::from_millis(100),
            reserved_timeout: Duration::from_millis(100),
            quarantine: Duration::from_millis(5),
            landing_timeout: Duration::from_millis(100),
            head: Head::Ferry,
            alloc_hold: Duration::from_millis(50),
        };
        harness::instance(Instant(0), &who, &config, &LIMITS)
    };
    let insts = vec![
        bare("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
        bare("denoiser", "den-1", "tcp://den:2"),
    ];
    let mut w = World::new(coord, insts);
    assert!(w.insts.iter().all(Instance::is_registered));
    // Writes stay pending, so every transfer holds its receiver's room.
    w.writes = None;
    let in_use = |w: &World<'_>| {
        let mut v: Vec<(u32, u32)> = w.coord.capacity_in_use().map(|(p, n)| (p.0, n)).collect();
        v.sort_unstable();
        v
    };
    // 16 KiB fits no slot: by room (a tie goes to the first registered).
    w.stage(0, "big-a", 16 * KIB);
    assert_eq!(in_use(&w), vec![(1, 0), (2, 1), (3, 0)]);
    w.stage(0, "big-b", 16 * KIB);
    assert_eq!(in_use(&w), vec![(1, 0), (2, 1), (3, 1)]);
    w.stage(0, "big-c", 16 * KIB);
    assert_eq!(in_use(&w), vec![(1, 0), (2, 2), (3, 1)]);
    // 4 KiB fits den-0's free slots: there, though den-1 has more room.
    w.stage(0, "small", 4 * KIB);
    assert_eq!(in_use(&w), vec![(1, 0), (2, 3), (3, 1)]);
    assert_eq!(w.coord.stats().fast_path, 1);
}

// ---- leaving: drain, then leave ---------------------------------------------

/// An encoder and two denoisers around a ferry coordinator.
fn two_receivers() -> World<'static> {
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
        instance("denoiser", "den-1", "tcp://den:2"),
    ];
    let w = World::new(coordinator(8), insts);
    assert!(w.insts.iter().all(Instance::is_registered));
    w
}

#[test]
fn a_draining_receiver_finishes_what_it_holds_and_gets_no_new_work() {
    let mut w = two_receivers();
    // Round robin sends the first to den-0, whose application holds it.
    w.stage(0, "a", 20 * KIB);
    let [held] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.insts[1].drain(w.now);
    w.pump();
    assert!(w.coord_events.iter().any(|e| matches!(e,
        CoordinatorEvent::Deregistered { peer: PeerId(2), role: 1, draining: true, reason }
            if reason.as_str() == "instance draining")));
    assert_eq!(w.insts[1].in_flight(), 1);
    assert!(!w.insts[1].is_drained());
    // New work, on the slow path and the fast path, goes to den-1 only.
    for (id, size) in [("b", 20 * KIB), ("c", 4 * KIB), ("d", 4 * KIB)] {
        w.stage(0, id, size);
        let got = w.received(2);
        let token = *got.last().unwrap();
        assert_eq!(w.insts[2].received(token).unwrap().id, id);
        w.insts[2].release(token, None).unwrap();
        w.pump();
    }
    assert_eq!(w.received(1).len(), 1, "nothing new reached den-0");
    // What den-0 holds ends as usual, and its drain is over.
    w.insts[1].release(held, None).unwrap();
    w.pump();
    assert_eq!(w.insts[1].in_flight(), 0);
    // The coordinator told it nothing more is addressed to it.
    assert!(w.insts[1].is_drained());
    assert!(w
        .from_coordinator
        .iter()
        .any(|m| m.contains("transfer_deregister") && m.contains("den-0")));
    assert_eq!(w.delivered(), 4);
    w.insts[1].leave(w.now, "drained");
    w.pump();
    assert!(w.coord_events.iter().any(|e| matches!(e,
        CoordinatorEvent::Deregistered { peer: PeerId(2), role: 1, draining: false, reason }
            if reason.as_str() == "drained")));
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    assert_eq!(w.coord.members(), 2);
    assert_eq!(w.coord.in_flight(), 0);
    // Nothing more reaches it, and it registers no more.
    w.advance(50);
    assert_eq!(w.sent(MsgType::Register), 3);
}

#[test]
fn a_draining_instance_stages_nothing_new_and_rejects_an_alloc_for_another_receiver() {
    let mut w = two_receivers();
    // The coordinator does not hear of den-0's drain (the message is
    // lost), so it still asks den-0 for a slot: den-0 refuses, retryably,
    // and the request goes to den-1.
    w.drop = vec![MsgType::Deregister];
    w.insts[1].drain(w.now);
    w.pump();
    assert_eq!(
        w.insts[1].stage("x", KIB).unwrap_err(),
        InstanceError::Draining
    );
    w.stage(0, "a", 20 * KIB);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    assert!(w
        .from_instances
        .iter()
        .any(|m| m.contains("instance draining")));
    w.advance(2);
    let [token] = w.received(2)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.insts[2].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    assert!(w.failed().is_empty());
}

#[test]
fn leaving_fails_what_is_held_and_every_peer_hears_it() {
    let mut w = two_receivers();
    // den-0 holds "a"; "b" is being written to den-0 when it leaves.
    w.stage(0, "a", 20 * KIB);
    let [held] = w.received(1)[..] else { panic!() };
    w.writes = None;
    w.stage(0, "b", 12 * KIB);
    w.stage(0, "c", 12 * KIB);
    let (_, to_den0) = w
        .pending
        .iter()
        .copied()
        .find(|(_, wr)| wr.id.as_str() == "c")
        .unwrap();
    assert_eq!(to_den0.dest_session.as_str(), "den-0");
    w.insts[1].leave(w.now, "stopped before its drain ended");
    w.pump();
    // The coordinator failed both of den-0's transfers and told the
    // encoder of the one it still writes.
    assert_eq!(w.failed(), vec![FailReason::PeerLeft, FailReason::PeerLeft]);
    assert!(w
        .inst_events
        .iter()
        .any(|(i, e)| *i == 0
            && matches!(e, InstanceEvent::SendFailed { id, .. } if id.as_str() == "c")));
    assert!(w
        .from_coordinator
        .iter()
        .any(|m| m.contains("transfer_abort") && m.contains("instance left")));
    // The application holding "a" hears it was aborted, and releases it
    // as usual; nothing more goes out of den-0.
    assert!(w.inst_events.contains(&(1, InstanceEvent::Aborted(held))));
    let before = w.from_instances.len();
    w.insts[1].release(held, None).unwrap();
    w.pump();
    assert_eq!(w.from_instances.len(), before);
    assert_eq!(w.insts[1].requests_held(), 0);
    // The encoder's writes complete: "c" (aborted) is not reported, "b"
    // (to den-1) is delivered.
    for (i, wr) in std::mem::take(&mut w.pending) {
        w.insts[i]
            .handle_completion(w.now, wr.token, Ok(()))
            .unwrap();
    }
    w.pump();
    let last = *w.received(2).last().unwrap();
    w.insts[2].release(last, None).unwrap();
    w.pump();
    assert_eq!(w.coord.in_flight(), 0);
    assert_eq!(w.coord.members(), 2);
    assert_eq!(w.insts[1].handle(w.now, &decode(br#"{"msg_type":"transfer_alloc","request_id":"z","data_size":1,"source_role":"encoder"}"#).unwrap()), Err(Ignored::Left));
}

#[test]
fn a_draining_coordinator_takes_no_new_transfer_and_its_shutdown_aborts_the_rest() {
    world!(w, 8);
    w.stage(0, "a", 20 * KIB);
    let [held] = w.received(1)[..] else { panic!() };
    w.coord.drain();
    assert!(w.coord.is_draining());
    // A new transfer is refused at once; the sender hears why.
    w.stage(0, "b", KIB);
    assert_eq!(w.failed(), vec![FailReason::ShuttingDown]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "b" && reason.as_str() == "coordinator shutting down")));
    // So is a registration.
    w.insts.push(instance("denoiser", "den-9", "tcp://den:9"));
    w.pump();
    assert!(!w.insts[2].is_registered());
    assert_eq!(w.insts[2].refusal(), "coordinator shutting down");
    // What was in flight fails at shutdown; its receiver hears it.
    w.coord.shutdown(w.now);
    w.pump();
    assert_eq!(
        w.failed(),
        vec![FailReason::ShuttingDown, FailReason::ShuttingDown]
    );
    assert!(w.inst_events.contains(&(1, InstanceEvent::Aborted(held))));
    assert_eq!(w.coord.in_flight(), 0);
}

#[test]
fn under_sglangs_head_leaving_fails_each_receive_the_head_waits_on() {
    let mut inst = sglang_instance("denoiser", "den-0");
    outbox(&mut inst);
    let alloc = |id: &str, size: u64| {
        format!(
            r#"{{"msg_type":"transfer_alloc","request_id":"{id}","data_size":{size},"source_role":"encoder"}}"#
        )
    };
    // "a" has a reserved slot; a drain then fails a new ALLOC at once
    // (that head reads no reject, and holding it would only fail it later).
    feed(&mut inst, 0, &alloc("a", 20 * KIB)).unwrap();
    assert_eq!(outbox(&mut inst).len(), 1);
    inst.drain(Instant(MS));
    assert!(outbox(&mut inst).is_empty(), "nothing to tell that head");
    feed(&mut inst, 2, &alloc("b", KIB)).unwrap();
    let out = outbox(&mut inst);
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with(
            r#"{"msg_type":"transfer_done","request_id":"b","error":"instance draining""#
        ),
        "{out:?}"
    );
    assert_eq!(inst.in_flight(), 1);
    // Leaving fails "a" at the head, in a message it reads.
    inst.leave(Instant(3 * MS), "drain timed out");
    let out = outbox(&mut inst);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(
        out[0].starts_with(
            r#"{"msg_type":"transfer_done","request_id":"a","error":"drain timed out""#
        ),
        "{out:?}"
    );
    assert_eq!(inst.requests_held(), 0);
    assert_eq!(inst.pool().stats().live_slots, 2);
}

#[test]
fn a_sender_that_left_after_its_write_leaves_the_receiver_to_finish() {
    world!(w, 8);
    w.stage(0, "a", 20 * KIB);
    let [held] = w.received(1)[..] else { panic!() };
    // The encoder's part is over once its bytes are written: its drain
    // ends at once, and its leaving fails nothing.
    w.insts[0].drain(w.now);
    assert_eq!(w.insts[0].in_flight(), 0);
    w.insts[0].leave(w.now, "stopped");
    w.pump();
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    assert_eq!(w.coord.members(), 1);
    w.insts[1].release(held, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    assert_eq!(w.coord.in_flight(), 0);
}

#[test]
fn a_drain_waits_for_a_fast_path_transfer_it_did_not_know_of() {
    let mut w = two_receivers();
    // A fast-path transfer to den-0 is being written when den-0 drains:
    // the coordinator took den-0's preallocated slot, and den-0 has no
    // record of it yet.
    w.writes = None;
    w.stage(0, "a", 4 * KIB);
    assert_eq!(w.sent(MsgType::Alloc), 0, "fast path");
    w.insts[1].drain(w.now);
    w.pump();
    assert_eq!(w.insts[1].in_flight(), 0);
    assert!(!w.insts[1].is_drained(), "a transfer to it is on its way");
    for (i, wr) in std::mem::take(&mut w.pending) {
        w.insts[i]
            .handle_completion(w.now, wr.token, Ok(()))
            .unwrap();
    }
    w.pump();
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    assert!(!w.insts[1].is_drained());
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert!(w.insts[1].is_drained());
    w.insts[1].leave(w.now, "drained");
    w.pump();
    assert_eq!(w.delivered(), 1);
    assert!(w.failed().is_empty(), "{:?}", w.failed());
}

#[test]
fn an_instance_that_leaves_unanswered_is_announced_and_registers_no_more() {
    let insts = vec![instance("encoder", "enc-0", "tcp://enc:1")];
    let mut w = World::new(coordinator(8), Vec::new());
    // The coordinator accepts the registration, but its answer is lost.
    w.drop = vec![MsgType::RegisterAck];
    w.insts = insts;
    w.pump();
    assert_eq!(w.coord.members(), 1);
    assert!(!w.insts[0].is_registered());
    w.insts[0].leave(w.now, "stopped");
    w.pump();
    assert_eq!(w.coord.members(), 0, "the leaving reached the coordinator");
    let registrations = w.sent(MsgType::Register);
    w.advance(100);
    assert_eq!(w.sent(MsgType::Register), registrations);
    assert_eq!(w.insts[0].poll_timeout(), None);
}

#[test]
fn a_draining_coordinator_still_carries_a_request_to_its_end() {
    for head in [Head::Ferry, Head::Sglang] {
        let (mut w, _) = forward_world_with(head, |w| {
            w.coord.drain();
            // A new request is refused; the next leg of one in flight
            // (the denoiser's forward, which follows) is taken.
            w.stage(0, "r2", KIB);
            assert_eq!(w.failed(), vec![FailReason::ShuttingDown]);
        });
        let [dec] = w.received(2)[..] else {
            panic!("{head:?}: {:?}", w.inst_events)
        };
        w.insts[2].release(dec, None).unwrap();
        w.pump();
        assert_eq!(w.delivered(), 2, "{head:?}");
        assert_eq!(w.failed(), vec![FailReason::ShuttingDown], "{head:?}");
        assert_eq!(w.coord.in_flight(), 0);
    }
}

#[test]
fn a_sender_leaving_with_a_write_out_reports_it_before_it_says_it_is_gone() {
    let mut w = two_receivers();
    w.writes = None;
    w.stage(0, "a", 20 * KIB);
    assert_eq!(w.pending.len(), 1, "the write is posted");
    w.insts[0].leave(w.now, "stopped");
    w.pump();
    assert!(w.insts[0].is_leaving());
    assert!(!w.insts[0].has_left(), "its write is still out");
    assert_eq!(w.sent(MsgType::Deregister), 0);
    for (i, wr) in std::mem::take(&mut w.pending) {
        w.insts[i]
            .handle_completion(w.now, wr.token, Ok(()))
            .unwrap();
    }
    w.pump();
    assert!(w.insts[0].has_left());
    // The write's report went first, then the leaving: the transfer goes
    // on without its sender.
    let order: Vec<&str> = w
        .from_instances
        .iter()
        .filter_map(|m| {
            ["transfer_pushed", "transfer_deregister"]
                .into_iter()
                .find(|t| m.contains(t))
        })
        .collect();
    assert_eq!(order, ["transfer_pushed", "transfer_deregister"]);
    let token = *w.received(1).last().unwrap();
    w.insts[1].release(token, None).unwrap();
    w.pump();
    assert_eq!(w.delivered(), 1);
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    assert_eq!(w.insts[0].poll_timeout(), None);
}

// ---- who sent it: the coordinator's peer table -----------------------------

fn register_json(role: &str, ep: &str) -> String {
    format!(
        r#"{{"msg_type":"transfer_register","role":"{role}","session_id":"s-{ep}","pool_ptr":4096,"pool_size":65536,"work_endpoint":"{ep}"}}"#
    )
}

/// Every message the coordinator has queued, with the endpoint it goes to.
fn transmitted(c: &mut Coordinator<'static>) -> Vec<(String, String)> {
    let mut buf = vec![0u8; 4096];
    harness::coordinator_outbox(c, &mut buf)
        .into_iter()
        .map(|(to, m)| {
            let to = c.endpoint_of(to).unwrap_or("").to_owned();
            (to, String::from_utf8(m).unwrap())
        })
        .collect()
}

#[test]
fn a_flood_of_strangers_takes_a_bounded_table_and_members_keep_their_places() {
    let mut c = coordinator(8);
    let now = Instant(0);
    let den = c
        .handle_incoming(
            now,
            &incoming(
                "tcp://den:1",
                "",
                register_json("denoiser", "tcp://den:1").as_bytes(),
            ),
        )
        .unwrap();
    assert_eq!(transmitted(&mut c).len(), 1);
    let places = peer_table_len(LIMITS.members);
    for i in 0..10 * places {
        let ep = format!("tcp://forger:{i}");
        let reg = register_json("overlord", &ep);
        let r = c.handle_incoming(now, &incoming(&ep, "", reg.as_bytes()));
        let peer = r.unwrap();
        // Every place the forgers get is a stranger's, within the table.
        assert!(peer.0 as usize <= places, "{peer:?}");
        assert_ne!(peer, den);
        // The refusal goes to the forger that asked, and to no one else.
        let sent = transmitted(&mut c);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, ep);
        assert!(sent[0].1.contains("unknown role"), "{}", sent[0].1);
    }
    assert_eq!(c.members(), 1);
    assert_eq!(c.peer_at("tcp://den:1"), Some(den));
    assert_eq!(c.endpoint_of(den), Some("tcp://den:1"));
    // The member is still answered at its endpoint.
    let again = c
        .handle_incoming(
            now,
            &incoming(
                "tcp://den:1",
                "",
                register_json("denoiser", "tcp://den:1").as_bytes(),
            ),
        )
        .map(|_| ());
    assert!(
        matches!(
            again,
            Err(Unhandled::Ignored {
                why: Ignored::Duplicate,
                ..
            })
        ),
        "{again:?}"
    );
    assert_eq!(transmitted(&mut c)[0].0, "tcp://den:1");
}

#[test]
fn an_answer_queued_for_a_place_that_changed_hands_is_not_sent_to_its_new_holder() {
    let config = paths::COORDINATOR;
    let mut storage = CoordinatorStorage::owned(&LIMITS);
    // Room for the members and one stranger more.
    storage.peers = vec![PeerSlot::EMPTY; LIMITS.members + 1].into();
    let mut c = Coordinator::new(&PIPELINE, config, storage).unwrap();
    let now = Instant(0);
    let mut first = None;
    for i in 0..=LIMITS.members + 1 {
        let ep = format!("tcp://x:{i}");
        let p = c
            .handle_incoming(
                now,
                &incoming(&ep, "", register_json("overlord", &ep).as_bytes()),
            )
            .unwrap();
        first.get_or_insert(p);
    }
    // Every refusal was queued; the places of the first strangers went to
    // the last ones before any was sent. Only the answers whose place is
    // still their addressee's go out, each to its own asker.
    let sent = transmitted(&mut c);
    assert_eq!(sent.len(), LIMITS.members + 1);
    for (to, msg) in &sent {
        assert!(
            msg.contains(&format!(r#""session_id":"s-{to}""#)),
            "{to}: {msg}"
        );
    }
    assert_eq!(c.stats().transmits_dropped, 1);
    assert_eq!(
        c.endpoint_of(first.unwrap()),
        Some(&*format!("tcp://x:{}", LIMITS.members + 1))
    );
    // A table no larger than the member table is refused outright.
    let mut storage = CoordinatorStorage::owned(&LIMITS);
    storage.peers = vec![PeerSlot::EMPTY; LIMITS.members].into();
    assert_eq!(
        Coordinator::new(&PIPELINE, config, storage).err(),
        Some(ConfigError::PeerTableTooSmall)
    );
}

#[test]
fn without_sender_names_a_registration_names_its_endpoint_and_a_result_counts_as_done() {
    // A channel that cannot name senders (ZeroMQ's PULL): each role
    // reports to an endpoint of its own, as under sglang's head.
    let mut coord = coordinator(8);
    coord
        .set_role_endpoint("encoder", "tcp://coord:enc")
        .unwrap();
    coord
        .set_role_endpoint("denoiser", "tcp://coord:den")
        .unwrap();
    assert_eq!(
        coord.set_role_endpoint("painter", "tcp://coord:p"),
        Err(ConfigError::UnknownRole)
    );
    let mut enc = instance("encoder", "enc-0", "tcp://enc:1");
    let mut den = instance("denoiser", "den-0", "tcp://den:1");
    let mut buf = vec![0u8; 16 * 1024];
    let mut now = Instant(0);
    // Each side's messages, delivered without a sender's name.
    let mut deliver = |coord: &mut Coordinator<'static>,
                       inst: &mut Instance<'static>,
                       via: &str,
                       now: Instant| {
        let mut results = Vec::new();
        while let Some(n) = inst.poll_transmit(&mut buf) {
            let n = n.unwrap();
            results.push(coord.handle_incoming(now, &incoming("", via, &buf[..n])));
        }
        results
    };
    let to_insts = |coord: &mut Coordinator<'static>,
                    enc: &mut Instance<'static>,
                    den: &mut Instance<'static>,
                    now: Instant| {
        for (to, msg) in transmitted(coord) {
            let msg = decode(msg.as_bytes()).unwrap();
            let inst = if to == "tcp://enc:1" {
                &mut *enc
            } else {
                &mut *den
            };
            let _ = inst.handle(now, &msg);
        }
    };
    for r in deliver(&mut coord, &mut enc, "tcp://coord:enc", now) {
        assert_eq!(coord.endpoint_of(r.unwrap()), Some("tcp://enc:1"));
    }
    for r in deliver(&mut coord, &mut den, "tcp://coord:den", now) {
        assert_eq!(coord.endpoint_of(r.unwrap()), Some("tcp://den:1"));
    }
    to_insts(&mut coord, &mut enc, &mut den, now);
    assert!(enc.is_registered() && den.is_registered());
    // encoder → denoiser, every message judged by content and endpoint.
    let (token, _) = enc.stage("r-1", 4 * KIB).unwrap();
    let dims = [4 * KIB];
    let entries = [blob(&dims)];
    let scalars = RawJson::parse_object("{}").unwrap();
    enc.commit(now, token, 4 * KIB, &Manifest::Entries(&entries), scalars)
        .unwrap();
    for _ in 0..4 {
        now = Instant(now.0 + MS);
        deliver(&mut coord, &mut enc, "tcp://coord:enc", now);
        deliver(&mut coord, &mut den, "tcp://coord:den", now);
        while let Some(w) = enc.poll_action() {
            enc.handle_completion(now, w.token, Ok(())).unwrap();
        }
        to_insts(&mut coord, &mut enc, &mut den, now);
    }
    assert!(
        std::iter::from_fn(|| den.poll_event()).any(|e| matches!(e, InstanceEvent::Received(_)))
    );
    assert_eq!(coord.in_flight(), 1);
    // The denoiser's result (a tensor multipart whose first frame is its
    // descriptor), not a `transfer_done`, ends the leg.
    let result = br#"{"tensor_descriptors":[],"scalar_fields":{"request_id":"r-1"}}"#;
    let done = Incoming {
        from: "",
        via: "tcp://coord:den",
        magic: result,
        payload: b"",
    };
    coord.handle_incoming(now, &done).unwrap();
    assert_eq!(coord.in_flight(), 0);
    assert!(std::iter::from_fn(|| coord.poll_event())
        .any(|e| matches!(e, CoordinatorEvent::Delivered { leg: 0, .. })));
    // Arriving at no role's endpoint, a message no content names is
    // nobody's.
    let pushed = br#"{"msg_type":"transfer_pushed","request_id":"r-9","success":true}"#;
    assert_eq!(
        coord.handle_incoming(now, &incoming("", "tcp://coord:other", pushed)),
        Err(Unhandled::UnknownSender)
    );
}

#[test]
fn garbage_and_foreign_messages_are_told_apart_and_change_nothing() {
    let mut c = coordinator(8);
    let bad = c.handle_incoming(Instant(0), &incoming("tcp://x:1", "", b"{not json"));
    assert!(matches!(bad, Err(Unhandled::Malformed(_))), "{bad:?}");
    let foreign = Incoming {
        from: "tcp://x:1",
        via: "",
        magic: b"req-1",
        payload: b"\x80\x04pickled",
    };
    assert_eq!(
        c.handle_incoming(Instant(0), &foreign),
        Err(Unhandled::Foreign)
    );
    assert_eq!(c.members(), 0);
    assert!(transmitted(&mut c).is_empty());
    // An endpoint longer than the coordinator keeps is no one's.
    let long = format!("tcp://{}:1", "h".repeat(200));
    let reg = register_json("denoiser", "tcp://d:1");
    assert!(matches!(
        c.handle_incoming(Instant(0), &incoming(&long, "", reg.as_bytes())),
        Err(Unhandled::Ignored {
            why: Ignored::TooLong(_),
            ..
        })
    ));
}

#[test]
fn a_members_connection_closing_fails_its_transfers_at_once() {
    world!(w, 4);
    w.writes = None;
    w.stage(0, "r-1", 4 * KIB);
    assert_eq!(w.coord.in_flight(), 1);
    assert!(!w.coord.handle_gone(w.now, "tcp://nobody:1"));
    assert!(w.coord.handle_gone(w.now, "tcp://den:1"));
    assert_eq!(w.coord.in_flight(), 0);
    assert_eq!(w.coord.members(), 1);
    w.pump();
    assert_eq!(w.failed(), [FailReason::PeerGone]);
}

#[test]
fn a_registration_with_more_preallocated_slots_than_the_limit_is_refused() {
    let mut c = coordinator(8);
    let slots = |n: u64| {
        (0..n)
            .map(|i| {
                let off = i * 8192;
                format!(
                    r#"{{"offset":{off},"size":8192,"slot_id":{i},"addr":{}}}"#,
                    4096 + off
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let reg = |ep: &str, n: u64| {
        format!(
            r#"{{"msg_type":"transfer_register","role":"denoiser","session_id":"s-{ep}","pool_ptr":4096,"pool_size":1048576,"work_endpoint":"{ep}","preallocated_slots":[{}]}}"#,
            slots(n)
        )
    };
    // As many as the limit: taken.
    let n = LIMITS.prealloc_per_member as u64;
    let (r, ack) = answer_to(&mut c, 1, reg("tcp://d:1", n).as_bytes());
    assert_eq!(r, Ok(()));
    assert!(ack.unwrap().contains(r#""accepted":true"#));
    // One more: refused, and said why.
    let (_, ack) = answer_to(&mut c, 2, reg("tcp://d:2", n + 1).as_bytes());
    let ack = ack.unwrap();
    assert!(ack.contains(r#""accepted":false"#), "{ack}");
    assert!(
        ack.contains("more preallocated_slots than the coordinator takes"),
        "{ack}"
    );
    assert_eq!(c.members(), 1);
}

#[test]
fn a_pipeline_that_names_a_role_twice_is_refused() {
    let storage = CoordinatorStorage::owned(&LIMITS);
    let r = Coordinator::new(
        &["encoder", "denoiser", "encoder"],
        CoordinatorConfig::FERRY,
        storage,
    );
    assert_eq!(r.err(), Some(ConfigError::Pipeline));
}
