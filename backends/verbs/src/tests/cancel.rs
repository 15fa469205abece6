//! Writes that end unfinished, because their caller gave up
//! (`Transport::cancel_transfers`) or their write timeout passed: a
//! completion is final. The stand-in's peer stops taking work (`stall`),
//! so work requests wait on the queue pair unexecuted, as on a NIC whose
//! peer does not answer; once the writes' completions are handed out, the
//! caller changes its source and the peer goes on, and none of their bytes
//! ever lands: their work requests were flushed, not run.

use tensorferry_core::transport::{Completion, FaultKind, Transport};
use tensorferry_hostmem::HostPool;

use super::{config, connect, drain, fill, node, pair, release, stall, waiting, Node, ASIDE, LEN};
use crate::conn::ConnState;
use crate::device::RdmaOp;
use crate::error::VerbsError;
use crate::sim::SimDevice;
use crate::transport::VerbsTransport;

/// A node connected to a peer, the first `LEN` bytes of its pool filled
/// from `pattern`.
fn connected_pair(pattern: u64) -> (Node, Node) {
    let (mut a, b) = pair();
    connect(&mut a, &b, 1);
    fill(&mut a.bytes_mut()[..LEN as usize], pattern);
    (a, b)
}

/// The peer goes on; the caller has reused its source. Nothing of the
/// ended writes may land in `to`'s first `LEN` bytes.
fn release_and_check_untouched(a: &mut Node, to: &Node) {
    fill(&mut a.bytes_mut()[..LEN as usize], 0xbad);
    release(a);
    assert!(
        to.bytes()[..LEN as usize].iter().all(|&x| x == 0),
        "an ended write landed"
    );
}

/// The next write to the peer connects anew and carries what the source
/// holds now.
fn rewrite_lands(a: &mut Node, to: &Node, cookie: u64) {
    a.write(0, LEN, to, 0, cookie).unwrap();
    let c = a.wait(1).remove(0);
    assert_eq!(c.cookie, cookie);
    assert!(c.result.is_ok(), "{:?}", c.result);
    assert_eq!(to.bytes()[..LEN as usize], a.bytes()[..LEN as usize]);
    assert_eq!(a.t.connection(to.t.session_id()), Some(ConnState::Ready));
}

#[test]
fn cancelled_writes_are_flushed_unrun_and_never_touch_their_memory_again() {
    let mut a = node();
    let (b, d) = (node(), node());
    connect(&mut a, &b, 1);
    connect(&mut a, &d, 2);
    fill(&mut a.bytes_mut()[..LEN as usize], 1);
    stall(&a, true);
    a.write(0, LEN, &b, 0, 4).unwrap();
    assert_eq!(waiting(&a), 8, "a window of work requests waits on the QP");
    assert!(a.t.poll_completion().is_none(), "the stalled write runs on");

    a.t.cancel_transfers(b.t.session_id()).unwrap();
    assert_eq!(waiting(&a), 0, "flushed before cancel_transfers returned");
    assert_eq!(
        a.t.with_device_mut(|dev| dev.posts_refused),
        0,
        "the marker had its slot in the full window's send queue"
    );
    let done = drain(&mut a);
    let [c] = &done[..] else { panic!("{done:?}") };
    assert_eq!(c.cookie, 4);
    match &c.result {
        Err(e @ VerbsError::Cancelled { op, peer }) => {
            assert_eq!(*op, RdmaOp::Write);
            assert_eq!(peer, b.t.session_id());
            assert_eq!(e.kind(), FaultKind::Timeout);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.t.connection(b.t.session_id()), None);
    assert_eq!(
        a.t.connection(d.t.session_id()),
        Some(ConnState::Ready),
        "the other peer's connection goes on"
    );

    release_and_check_untouched(&mut a, &b);
    rewrite_lands(&mut a, &b, 5);
    assert_eq!(a.t.with_device_mut(|dev| dev.qps_created), 3);
}

#[test]
fn a_write_that_finished_before_the_cancel_completes_as_it_did() {
    let (mut a, b) = connected_pair(2);
    // Executed and acknowledged; its completion waits in the CQ.
    a.write(0, 4096, &b, ASIDE, 2).unwrap();
    stall(&a, true);
    a.write(0, LEN, &b, 0, 3).unwrap();
    a.t.cancel_transfers(b.t.session_id()).unwrap();
    let done = drain(&mut a);
    let outcomes: Vec<(u64, Option<FaultKind>)> = done
        .iter()
        .map(|c| (c.cookie, c.result.as_ref().err().map(VerbsError::kind)))
        .collect();
    assert_eq!(outcomes, [(2, None), (3, Some(FaultKind::Timeout))]);
    assert_eq!(
        b.bytes()[ASIDE as usize..ASIDE as usize + 4096],
        a.bytes()[..4096]
    );
    release_and_check_untouched(&mut a, &b);
}

#[test]
fn a_write_past_its_write_timeout_is_flushed_before_it_fails() {
    let (mut a, b) = connected_pair(3);
    stall(&a, true);
    a.write(0, LEN, &b, 0, 2).unwrap();
    a.write(0, 10, &b, ASIDE + 4096, 3).unwrap();
    // The sweep fails the connection once the write timeout passed.
    let mut done = a.wait(2);
    done.sort_by_key(|c| c.cookie);
    assert_eq!(waiting(&a), 0, "flushed before the failure was reported");
    assert_eq!(a.t.with_device_mut(|dev| dev.posts_refused), 0);
    match &done[0].result {
        Err(e @ VerbsError::Timeout { peer, .. }) => {
            assert_eq!(peer, b.t.session_id());
            assert_eq!(e.kind(), FaultKind::Timeout);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(done[1].result, Err(VerbsError::Broken { .. })),
        "{:?}",
        done[1].result
    );
    release_and_check_untouched(&mut a, &b);
    assert!(b.bytes()[ASIDE as usize + 4096..][..10]
        .iter()
        .all(|&x| x == 0));
    rewrite_lands(&mut a, &b, 4);
}

/// Cancelled at once after it was posted, the write races its connection
/// (the side channel may connect and post half of it, the window, before
/// the cancel): whatever landed by its completion, nothing lands after.
#[test]
fn a_write_cancelled_while_its_connection_is_made_moves_nothing_after_its_completion() {
    let (mut a, b) = pair();
    fill(&mut a.bytes_mut()[..LEN as usize], 4);
    a.write(0, LEN, &b, 0, 1).unwrap();
    a.t.cancel_transfers(b.t.session_id()).unwrap();
    assert_cancelled(&drain(&mut a), 1);
    let at_completion = b.bytes()[..LEN as usize].to_vec();
    // Nothing to end: a peer without writes, and one never written to.
    a.t.cancel_transfers(b.t.session_id()).unwrap();
    a.t.cancel_transfers("verbs:0000000000000001@tcp://127.0.0.1:1")
        .unwrap();
    assert!(a.t.poll_completion().is_none());
    fill(&mut a.bytes_mut()[..LEN as usize], 0xbad);
    connect(&mut a, &b, 2);
    for _ in 0..20 {
        assert!(a.t.poll_completion().is_none(), "a stray completion");
    }
    assert_eq!(waiting(&a), 0);
    assert!(
        b.bytes()[..LEN as usize] == at_completion[..],
        "bytes landed after the write's completion"
    );
    rewrite_lands(&mut a, &b, 3);
}

/// The one completion in `done` is write `cookie`'s, cancelled.
fn assert_cancelled(done: &[Completion<VerbsError>], cookie: u64) {
    assert!(
        matches!(
            done,
            [Completion {
                cookie: c,
                result: Err(VerbsError::Cancelled { .. })
            }] if *c == cookie
        ),
        "{done:?}"
    );
}

/// A stalled write (cookie 2, its source filled with `pattern`) is
/// cancelled while the provider refuses work on the queue pair in error
/// with `errno`; `after_cancel` checks what the cancel did. The write
/// ends cancelled with nothing of it landing, and the next write connects
/// anew.
fn cancel_while_posts_are_refused(pattern: u64, errno: i32, after_cancel: impl FnOnce(&mut Node)) {
    let (mut a, b) = connected_pair(pattern);
    stall(&a, true);
    a.write(0, LEN, &b, 0, 2).unwrap();
    a.t.with_device_mut(|d| d.post_in_error_errno = Some(errno));
    a.t.cancel_transfers(b.t.session_id()).unwrap();
    after_cancel(&mut a);
    assert_eq!(waiting(&a), 0);
    assert_cancelled(&drain(&mut a), 2);
    a.t.with_device_mut(|d| d.post_in_error_errno = None);
    release_and_check_untouched(&mut a, &b);
    rewrite_lands(&mut a, &b, 3);
}

#[test]
fn a_queue_pair_that_refuses_the_marker_is_destroyed_before_its_writes_complete() {
    // A provider that refuses work on a queue pair in error: no marker
    // can show the flush, so the queue pair is destroyed (the last
    // resort), which ends its work too.
    cancel_while_posts_are_refused(5, libc::EINVAL, |_| {});
}

#[test]
fn a_marker_the_send_queue_never_takes_ends_by_the_last_resort_in_time() {
    // "Send queue full", which polling normally cures, forever: the
    // marker is tried again until the flush wait passes, then the queue
    // pair is destroyed.
    cancel_while_posts_are_refused(7, libc::ENOMEM, |a| {
        assert!(a.t.with_device_mut(|d| d.posts_refused) > 1, "tried again");
    });
}

#[test]
fn a_marker_waits_for_room_in_a_full_cq() {
    let mut device = SimDevice::new([127, 0, 0, 1], 1024);
    device.cq_capacity = 3;
    let mut t = VerbsTransport::with_device(device, &config()).unwrap();
    let pool = HostPool::new(1 << 20).unwrap();
    // SAFETY: the pool moves into `a` behind the transport, so it is
    // unmapped after the transport (and its registration) is gone.
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.unwrap();
    let mut a = Node { t, pool, region };
    let b = node();
    connect(&mut a, &b, 1);
    fill(&mut a.bytes_mut()[..LEN as usize], 6);
    stall(&a, true);
    // 64 work requests of 1 KiB; the CQ's 3 places fill first.
    a.write(0, LEN, &b, 0, 2).unwrap();
    assert_eq!(waiting(&a), 3);
    a.t.cancel_transfers(b.t.session_id()).unwrap();
    assert_eq!(waiting(&a), 0);
    assert_cancelled(&drain(&mut a), 2);
    let peak = a.t.with_device_mut(|dev| dev.cq_peak);
    assert!(peak <= 3, "{peak} completions waited in a CQ of 3");
    release_and_check_untouched(&mut a, &b);
    rewrite_lands(&mut a, &b, 3);
}
