//! Receivers whose data plane reports arrivals (its completions do not
//! mean delivery): a transfer is handed over only once its write landed,
//! and a slot whose bytes may still come stays out of use.

use std::time::Duration;

use super::error_sent;
use crate::harness::blob;
use crate::paths::*;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::json::RawJson;
use tensorferry_core::transport::{Landed, WriteTag};
use tensorferry_core::wire::{Manifest, MsgType};

/// An encoder, and a denoiser whose data plane reports arrivals (its
/// completions do not mean delivery): transfers wait for their write to
/// land, at most `$landing` ms.
macro_rules! gated_world {
    ($w:ident, $landing:expr) => {
        let insts = vec![
            instance("encoder", "enc-0", "tcp://enc:1"),
            instance_serving(
                "denoiser",
                "den-0",
                "tcp://den:1",
                Serving {
                    landing: Some(Duration::from_millis($landing)),
                    ..Serving::FERRY
                },
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
    let offset = w.insts[1].slot_for(id).unwrap().offset;
    WriteTag::of(id, POOL_PTR + offset)
}

/// Stages `id` (6 KiB) at the sender: the tag its write's arrival must
/// carry, which the receiver waits for.
fn stage_awaited(w: &mut World<'_>, id: &str) -> WriteTag {
    w.stage(0, id, 6 * KIB);
    awaited(w, id)
}

/// The receiver told the coordinator the write never landed and handed
/// nothing over; nothing is held anywhere.
#[track_caller]
fn assert_never_landed(w: &World<'_>) {
    assert_eq!(error_sent(w, "transfer_done"), "write never landed");
    assert!(w.received(1).is_empty());
    w.assert_clean();
}

#[test]
fn a_gated_receiver_hands_over_a_transfer_only_once_its_write_landed() {
    gated_world!(w, 3);
    w.wire.writes = None;
    // The fast path (a preallocated slot), then the slow one (too large
    // for those).
    for (n, (id, size)) in [("fast", 6 * KIB), ("slow", 20 * KIB)]
        .into_iter()
        .enumerate()
    {
        w.stage(0, id, size);
        let write = w.complete_last();
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

/// Stages `id` (6 KiB) with its write held, and reports the write landed
/// before its `transfer_ready` came: nothing is handed over for it yet.
/// The write stays held for the test to complete.
fn landed_before_ready(w: &mut World<'_>, id: &str) {
    w.stage_held(0, id, 6 * KIB);
    let tag = w.pending.last().unwrap().1.tag;
    assert!(!w.insts[1].handle_landed(w.now, Landed::of(tag)));
}

/// The bytes do not travel through the coordinator, the ready does: a
/// write reported landed before its `transfer_ready` came is remembered,
/// and the transfer is handed over as soon as the ready comes.
#[test]
fn a_write_that_landed_before_its_ready_is_handed_over_when_the_ready_comes() {
    gated_world!(w, 3);
    landed_before_ready(&mut w, "early");
    assert_eq!(w.insts[1].awaiting_landing(), 0, "no ready yet");
    w.complete_last();
    let [token] = w.received(1)[..] else {
        panic!("handed over with the ready: {:?}", w.received(1))
    };
    assert_eq!(w.insts[1].awaiting_landing(), 0);
    w.consume(token);
    w.assert_done(1);
}

/// A remembered arrival is forgotten after the landing limit: a ready that
/// late is not taken for those bytes, and waits (then fails) as any other.
#[test]
fn an_arrival_no_ready_claims_is_forgotten_after_the_landing_limit() {
    gated_world!(w, 3);
    landed_before_ready(&mut w, "stale");
    w.now = w.now + Duration::from_millis(3);
    w.complete_last();
    assert!(w.received(1).is_empty(), "the arrival was forgotten");
    assert_eq!(w.insts[1].awaiting_landing(), 1);
    w.advance(3 + 5);
    assert_never_landed(&w);
}

#[test]
fn a_write_that_never_lands_is_refused_after_its_slot_sat_out_a_quarantine() {
    gated_world!(w, 3);
    let tag = stage_awaited(&mut w, "lost");
    let offset = w.insts[1].slot_for("lost").unwrap().offset;
    // The landing limit passes: nothing is handed over, nothing reported
    // yet, and the slot stays held (the bytes may still come).
    w.advance(3);
    assert!(w.received(1).is_empty());
    assert_eq!(w.sent(MsgType::Done), 0);
    assert_eq!(w.insts[1].slot_for("lost").map(|s| s.offset), Some(offset));
    assert_eq!(w.insts[1].stats().never_landed, 1);
    assert_eq!(w.insts[1].prealloc_in_use(), 1);
    assert_eq!(w.coord.prealloc_taken(), 1);
    // A notice after the limit hands nothing over.
    assert!(!w.insts[1].handle_landed(w.now, Landed::of(tag)));
    // The quarantine ends: the slot is free, and only now does the
    // coordinator hear of the failure (and may reuse the slot).
    w.advance(5);
    assert_eq!(w.failed(), vec![FailReason::ReceiverError]);
    assert_never_landed(&w);
}

#[test]
fn an_abort_while_landing_quarantines_the_slot_and_reports_when_it_is_free() {
    // The receiver's gate (20 ms) outlasts the coordinator's done timeout
    // (10 ms): the coordinator aborts first.
    gated_world!(w, 20);
    stage_awaited(&mut w, "r");
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
    assert_never_landed(&w);
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
