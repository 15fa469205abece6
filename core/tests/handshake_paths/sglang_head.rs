//! sglang's head and its flow: a forward under either head, and an
//! instance serving under sglang's head (one registration, held ALLOCs, no
//! announcement of a failed write).

use super::{feed, forward_world, outbox, sglang_instance};
use crate::paths::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::Instant;
use tensorferry_core::json::RawJson;
use tensorferry_core::wire::{decode, Manifest, Msg};

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
