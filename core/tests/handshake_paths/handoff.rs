//! A hand-off's own paths: the fast and the slow one, each phase timed,
//! retries after a reject and where they end, each timeout, a request
//! passing through every leg under one id, write cookies, and where a
//! policy places the data.

use std::time::Duration;

use crate::harness;
use crate::paths::{self, *};
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::Ignored;
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::wire::MsgType;

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
    w.consume(token);
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
    w.stage_held(0, "r1", 6 * KIB);
    // The push went out at once (fast path); the write takes 3 ms.
    w.advance(3);
    w.complete_last();
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
    w.consume(token);
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
    w.consume(token);
    w.assert_done(1);
}

/// Fills the receiver's pool (64 KiB, 16 KiB in preallocated slots) with
/// one 32 KiB transfer, `hold`, that the application holds, then stages
/// 32 KiB more as `id`: returns the held transfer.
fn fill_then_stage(w: &mut World<'_>, id: &str) -> Token {
    let held = w.hand_over("hold", 32 * KIB);
    w.stage(0, id, 32 * KIB);
    held
}

#[test]
fn a_retryable_reject_is_retried_after_backoff() {
    world!(w, 8);
    let held = fill_then_stage(&mut w, "next");
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    assert!(w.failed().is_empty());
    w.consume(held);
    w.advance(2);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    assert_eq!(w.sent(MsgType::Alloc), 3);
    let [_, token] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    w.consume(token);
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
    let held = fill_then_stage(&mut w, "doomed");
    // Attempts at 0, 1 and 3 ms (backoff 1 ms times the attempt number).
    w.advance(5);
    assert_eq!(w.sent(MsgType::AllocReject), 3);
    assert_eq!(w.failed(), vec![FailReason::Rejected]);
    assert_eq!(w.sent(MsgType::Abort), 2, "sender and receiver told");
    w.consume(held);
    assert_eq!(w.delivered(), 1);
    w.assert_clean_after(10);
}

#[test]
fn a_size_no_pool_can_hold_is_rejected_for_good() {
    // Staged from a larger pool than the receiver's: not retryable.
    let big_pool = Serving {
        pool: BuddyConfig {
            pool_size: 256 * KIB,
            ..POOL
        },
        ..Serving::FERRY
    };
    let insts = vec![
        instance_serving("encoder", "enc-0", "tcp://enc:1", big_pool),
        instance("denoiser", "den-0", "tcp://den:1"),
    ];
    let mut w = World::new(coordinator(8), insts);
    w.stage(0, "r", 128 * KIB);
    assert_eq!(w.failed(), vec![FailReason::Rejected]);
    assert_eq!(w.sent(MsgType::AllocReject), 1);
    w.assert_clean_after(10);
}

#[test]
fn a_failed_write_fails_the_request() {
    world!(w, 8);
    w.wire.writes = Some(Err("remote access error"));
    w.stage(0, "r", 20 * KIB);
    assert_eq!(w.failed(), vec![FailReason::WriteFailed]);
    assert!(w.inst_events.iter().any(|(i, e)| *i == 0
        && matches!(e, InstanceEvent::SendFailed { id, reason }
            if id.as_str() == "r" && reason.as_str() == "remote access error")));
    // The receiver's reserved slot sits out its quarantine, then frees.
    assert_eq!(w.insts[1].requests_held(), 1);
    w.assert_clean_after(10);
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
    w.time_out_alloc("r");
    w.assert_clean_after(10);
}

#[test]
fn push_timeout_and_the_late_completion() {
    world!(w, 8);
    w.stage_held(0, "r", 6 * KIB);
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::PushTimeout]);
    // The write completes after the abort: no report, slot freed.
    w.complete_last();
    assert_eq!(w.sent(MsgType::Pushed), 0);
    // The preallocated slot comes back after its quarantine.
    assert_eq!(w.coord.prealloc_taken(), 1);
    w.assert_clean_after(10);
}

#[test]
fn done_timeout_then_the_late_release() {
    world!(w, 8);
    let token = w.hand_over("r", 6 * KIB);
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::DoneTimeout]);
    assert!(w.inst_events.contains(&(1, InstanceEvent::Aborted(token))));
    // The application still reads; the preallocated slot stays parked.
    assert!(w.insts[1].received(token).is_some());
    assert_eq!(w.coord.prealloc_taken(), 1);
    w.consume(token);
    // The late transfer_done gives the slot back at once.
    assert_eq!(w.coord.prealloc_taken(), 0);
    w.assert_clean();
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
    w.stage_held(1, "r1", 6 * KIB);
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
    w.complete_last();
    let [output] = w.received(2)[..] else {
        panic!("{:?}", w.inst_events)
    };
    assert_eq!(w.insts[2].received(output).unwrap().id, "r1");
    w.insts[2].release(output, None).unwrap();
    w.consume(input);
    let delivered: Vec<_> = w
        .coord_events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::Delivered { id, leg, .. } => Some((id.as_str(), *leg)),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, [("r1", 1)]);
    w.assert_clean_after(100);
}

#[test]
fn write_cookies_are_tokens_and_a_stale_one_is_refused() {
    world!(w, 8);
    w.stage_held(0, "r", 6 * KIB);
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
    w.consume(token);
    w.assert_clean();
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
        let how = Serving {
            prealloc: Prealloc::NONE,
            ..Serving::FERRY
        };
        instance_serving(role, name, endpoint, how)
    };
    let insts = vec![
        bare("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
        bare("denoiser", "den-1", "tcp://den:2"),
    ];
    let mut w = World::new(coord, insts);
    assert!(w.insts.iter().all(Instance::is_registered));
    // Writes stay pending, so every transfer holds its receiver's room.
    w.wire.writes = None;
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
