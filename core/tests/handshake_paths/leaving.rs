//! Leaving: drain, then leave.

use super::{feed, forward_world_with, outbox, sglang_instance};
use crate::paths::*;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant, PeerId};
use tensorferry_core::wire::{decode, MsgType};

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
    w.consume(held);
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
    w.wire.drop = vec![MsgType::Deregister];
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
    let held = w.hand_over("a", 20 * KIB);
    w.stage_held(0, "b", 12 * KIB);
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
    w.consume(held);
    assert_eq!(w.from_instances.len(), before);
    assert_eq!(w.insts[1].requests_held(), 0);
    // The encoder's writes complete: "c" (aborted) is not reported, "b"
    // (to den-1) is delivered.
    w.complete_writes();
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
    let held = w.hand_over("a", 20 * KIB);
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
    let held = w.hand_over("a", 20 * KIB);
    // The encoder's part is over once its bytes are written: its drain
    // ends at once, and its leaving fails nothing.
    w.insts[0].drain(w.now);
    assert_eq!(w.insts[0].in_flight(), 0);
    w.insts[0].leave(w.now, "stopped");
    w.pump();
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    assert_eq!(w.coord.members(), 1);
    w.consume(held);
    assert_eq!(w.delivered(), 1);
    assert_eq!(w.coord.in_flight(), 0);
}

#[test]
fn a_drain_waits_for_a_fast_path_transfer_it_did_not_know_of() {
    let mut w = two_receivers();
    // A fast-path transfer to den-0 is being written when den-0 drains:
    // the coordinator took den-0's preallocated slot, and den-0 has no
    // record of it yet.
    w.stage_held(0, "a", 4 * KIB);
    assert_eq!(w.sent(MsgType::Alloc), 0, "fast path");
    w.insts[1].drain(w.now);
    w.pump();
    assert_eq!(w.insts[1].in_flight(), 0);
    assert!(!w.insts[1].is_drained(), "a transfer to it is on its way");
    w.complete_writes();
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    assert!(!w.insts[1].is_drained());
    w.consume(token);
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
    w.wire.drop = vec![MsgType::RegisterAck];
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
    w.stage_held(0, "a", 20 * KIB);
    assert_eq!(w.pending.len(), 1, "the write is posted");
    w.insts[0].leave(w.now, "stopped");
    w.pump();
    assert!(w.insts[0].is_leaving());
    assert!(!w.insts[0].has_left(), "its write is still out");
    assert_eq!(w.sent(MsgType::Deregister), 0);
    w.complete_writes();
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
    w.consume(token);
    assert_eq!(w.delivered(), 1);
    assert!(w.failed().is_empty(), "{:?}", w.failed());
    assert_eq!(w.insts[0].poll_timeout(), None);
}
