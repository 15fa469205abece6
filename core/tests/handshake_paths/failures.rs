//! What goes wrong and what it changes: the fail reasons and their texts
//! on the wire, a receiver's error, restarts and re-registrations,
//! duplicates, strangers and late messages, a full table, a lost
//! coordinator, forged requests.

use super::error_sent;
use crate::paths::*;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant, PeerId, REASON_LEN};
use tensorferry_core::json::RawJson;
use tensorferry_core::wire::{decode, Manifest, Msg, MsgType};

#[test]
fn failure_texts_reach_the_wire_cut_at_a_character_boundary() {
    world!(w, 8);
    // A data plane's own error text, longer than a reason holds, with a
    // two-byte character straddling the limit.
    let long = format!(
        "peer gone: fi_writemsg (peer den-0): {} (errno 111)",
        "é".repeat(REASON_LEN)
    );
    w.wire.writes = Some(Err(Box::leak(long.clone().into_boxed_str())));
    w.stage(0, "r", 6 * KIB);
    let pushed = error_sent(&w, "transfer_pushed");
    assert!(long.starts_with(&pushed), "{pushed}");
    assert!(pushed.len() == REASON_LEN || pushed.len() == REASON_LEN - 1);
    assert_eq!(w.failed(), vec![FailReason::WriteFailed]);
    w.advance(10);
    // The application's reason for failing a received transfer.
    w.wire.writes = Some(Ok(()));
    let token = w.hand_over("r2", 6 * KIB);
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
    let token = w.hand_over("r", 6 * KIB);
    w.insts[1].release(token, Some("decode failed")).unwrap();
    w.pump();
    assert_eq!(w.failed(), vec![FailReason::ReceiverError]);
    w.assert_clean();
}

#[test]
fn re_registration_fails_in_flight_transfers() {
    world!(w, 8);
    w.stage_held(0, "r", 20 * KIB);
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
    w.wire.writes = Some(Ok(()));
    // New work flows to the new session.
    let token = w.hand_over("r2", 6 * KIB);
    w.consume(token);
    w.assert_done(1);
}

#[test]
fn an_encoder_restarted_under_its_old_ids_is_told_the_ids_are_taken() {
    world!(w, 8);
    let token = w.hand_over("r1", 6 * KIB);
    w.consume(token);
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
    w.consume(token);
    w.assert_done(2);
}

#[test]
fn duplicates_and_strangers_change_nothing() {
    world!(w, 8);
    let mut buf = vec![0u8; 4096];
    // A duplicated transfer_staged.
    let token = w.hand_over("r", 6 * KIB);
    let staged =
        br#"{"msg_type":"transfer_staged","request_id":"r","data_size":6144,"session_id":"enc-0"}"#;
    let staged = decode(staged).unwrap();
    let pushed = decode(br#"{"msg_type":"transfer_pushed","request_id":"r"}"#).unwrap();
    let done = decode(br#"{"msg_type":"transfer_done","request_id":"r"}"#).unwrap();
    for (peer, msg, ignored) in [
        (1, staged, Ignored::Duplicate),
        // transfer_pushed twice.
        (1, pushed, Ignored::WrongState),
        // From a stranger, or from the wrong instance.
        (9, staged, Ignored::NotRegistered),
        (1, done, Ignored::WrongPeer),
    ] {
        assert_eq!(
            w.coord.handle(w.now, PeerId(peer), &msg),
            Err(ignored),
            "{msg:?}"
        );
    }
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
        w.coord.handle(w.now, PeerId(1), &staged),
        Err(Ignored::Duplicate)
    );
    w.assert_done(1);
}

#[test]
fn late_messages_after_an_abort_are_ignored() {
    world!(w, 8);
    w.time_out_alloc("r");
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
    w.stage_held(0, "a", 6 * KIB);
    w.stage(0, "b", 6 * KIB);
    assert_eq!(w.failed(), vec![FailReason::TableFull]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "b" && reason.as_str() == FailReason::TableFull.as_str())));
    assert_eq!(w.insts[0].requests_held(), 1, "only 'a' is still staged");
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
fn losing_the_coordinator_ends_what_it_relayed() {
    world!(w, 8);
    // Pushes never arrive: one request waits on the slow path with a slot
    // reserved at the receiver, one on the fast path, one in the queue.
    w.wire.drop = vec![MsgType::Push];
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
    w.wire.drop.clear();
    w.pump();
    assert!(w.insts.iter().all(Instance::is_registered));
    // The coordinator's own timers end its side; then all is clean, and a
    // new request goes through.
    w.assert_clean_after(200);
    w.stage(0, "after", 6 * KIB);
    let [token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.consume(token);
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
    w.consume(token);
    assert_eq!(w.delivered(), 1);
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
