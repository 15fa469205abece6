//! What fails, and how it is said: completion errors, a peer that
//! disappears or stalls, a stale session, a route that times out, a target
//! without a pool, malformed side-channel requests, a queue pair that
//! cannot be made.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{FaultKind, RegionError, Transport};
use tensorferry_zmq::zmq;

use super::{config, fill, node, pair, write_op};
use crate::conn::ConnState;
use crate::device::Verb;
use crate::error::VerbsError;
use crate::sim::SimDevice;
use crate::status::WcStatus;
use crate::transport::VerbsTransport;

#[test]
fn a_completion_error_names_the_peer_and_status_and_the_next_write_reconnects() {
    let (mut a, b) = pair();
    a.write_done(0, 10, &b, 0, 1);
    a.t.with_device_mut(|d| d.fail_next = Some(WcStatus::REMOTE_ACCESS));
    a.write(0, 10_000, &b, 0, 2).unwrap();
    a.write(0, 10, &b, 50_000, 3).unwrap();
    let done = a.wait(2);
    let first = done.iter().find(|c| c.cookie == 2).unwrap();
    match &first.result {
        Err(e @ VerbsError::Completion { peer, status, .. }) => {
            assert_eq!(peer, b.t.session_id());
            assert_eq!(*status, WcStatus::REMOTE_ACCESS);
            assert_eq!(e.kind(), FaultKind::OutOfBounds);
            assert!(e.to_string().contains("IBV_WC_REM_ACCESS_ERR"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let second = done.iter().find(|c| c.cookie == 3).unwrap();
    assert!(
        second.result.is_err(),
        "a write behind the failed one fails with it"
    );
    assert_eq!(
        a.t.connection(b.t.session_id()),
        None,
        "the connection is dropped"
    );
    fill(&mut a.bytes_mut()[..64], 99);
    a.write_done(0, 64, &b, 200_000, 4);
    assert_eq!(b.bytes()[200_000..200_064], a.bytes()[..64]);
    assert_eq!(
        a.t.with_device_mut(|d| d.qps_created),
        2,
        "rebuilt on next use"
    );
    assert_eq!(a.t.connection(b.t.session_id()), Some(ConnState::Ready));
}

#[test]
fn a_peer_that_disappears_fails_its_writes_and_its_endpoint_then_times_out() {
    let (mut a, b) = pair();
    let b_session = b.t.session_id().to_owned();
    let b_addr = b.region.addr;
    a.write_done(0, 10, &b, 0, 1);
    drop(b);
    a.t.post_write(&write_op(a.region, 0, 10, &b_session, b_addr, 2))
        .unwrap();
    let c = a.wait(1).remove(0);
    match &c.result {
        Err(e @ VerbsError::Completion { status, .. }) => {
            assert_eq!(*status, WcStatus::RETRY_EXCEEDED);
            assert_eq!(e.kind(), FaultKind::PeerGone);
        }
        other => panic!("{other:?}"),
    }
    // Nobody answers on the old endpoint now: the exchange times out.
    let t0 = Instant::now();
    a.t.post_write(&write_op(a.region, 0, 10, &b_session, b_addr, 3))
        .unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::ConnectTimeout { peer, .. }) => assert_eq!(peer, b_session),
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_session_of_an_earlier_incarnation_is_refused() {
    let (mut a, b) = pair();
    a.write_to_stale_incarnation(&b, 1).unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::Refused { .. }) => {
            assert!(e.to_string().contains("stale session"), "{e}");
            assert_eq!(e.kind(), FaultKind::PeerGone);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_rtr_timeout_is_reported_as_a_gid_or_route_problem() {
    let (mut a, b) = pair();
    a.t.with_device_mut(|d| d.rtr_errno = Some(libc::ETIMEDOUT));
    a.write(0, 10, &b, 0, 1).unwrap();
    match a.wait(1).remove(0).result {
        Err(e @ VerbsError::RouteTimeout { .. }) => {
            let s = e.to_string();
            assert!(s.contains("GID index"), "{s}");
            assert!(s.contains("::ffff:127.0.0.1"), "{s}");
        }
        other => panic!("{other:?}"),
    }
    // On the target's side the same failure refuses the request, with the
    // same explanation.
    a.t.with_device_mut(|d| d.rtr_errno = None);
    b.t.with_device_mut(|d| d.rtr_errno = Some(libc::ETIMEDOUT));
    a.write(0, 10, &b, 0, 2).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Refused { why, .. }) => assert!(why.contains("GID index"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stalled_peer_times_writes_out_and_the_connection_is_rebuilt() {
    let (mut a, b) = pair();
    a.write_done(0, 10, &b, 0, 1);
    a.t.with_device_mut(|d| d.hold = true);
    let t0 = Instant::now();
    a.write(0, 10, &b, 0, 2).unwrap();
    a.write(0, 10, &b, 100, 3).unwrap();
    let done = a.wait(2);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(800), "{waited:?}");
    let timed_out = done.iter().find(|c| c.cookie == 2).unwrap();
    assert!(
        matches!(timed_out.result, Err(VerbsError::Timeout { .. })),
        "{:?}",
        timed_out.result
    );
    assert!(matches!(
        done.iter().find(|c| c.cookie == 3).unwrap().result,
        Err(VerbsError::Broken { .. })
    ));
    // Completions of the failed connection that turn up late are ignored;
    // the next write gets a new queue pair.
    a.t.with_device_mut(|d| d.hold = false);
    a.write(0, 10, &b, 0, 4).unwrap();
    let c = a.wait(1).remove(0);
    assert_eq!(c.cookie, 4);
    assert!(c.result.is_ok(), "{:?}", c.result);
    assert!(a.t.poll_completion().is_none(), "no stray completions");
    assert_eq!(a.t.with_device_mut(|d| d.qps_created), 2);
}

#[test]
fn a_target_without_a_pool_refuses_and_deregistering_fails_pending_writes() {
    let mut a = node();
    let device = SimDevice::new([127, 0, 0, 1], 4096);
    let bare = VerbsTransport::with_device(device, &config()).unwrap();
    a.t.post_write(&write_op(a.region, 0, 10, bare.session_id(), 0, 1))
        .unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Refused { why, .. }) => {
            assert!(why.contains("no memory is registered"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    let b = node();
    a.t.with_device_mut(|d| d.hold = true);
    a.write(0, 10, &b, 0, 2).unwrap();
    // Connection and write in flight (held); deregistration fails it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.t.connection(b.t.session_id()) != Some(ConnState::Ready) {
        assert!(Instant::now() < deadline, "never connected");
        let _ = a.t.poll_completion();
        std::thread::sleep(Duration::from_millis(1));
    }
    a.t.deregister(a.region).unwrap();
    match a.wait(1).remove(0).result {
        Err(VerbsError::Broken { why, .. }) => assert!(why.contains("deregistered"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        a.t.deregister(a.region),
        Err(VerbsError::Region(RegionError::Unknown(1)))
    ));
}

#[test]
fn the_side_channel_refuses_malformed_requests_without_harm() {
    let b = node();
    let endpoint = b.t.endpoint().to_owned();
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::DEALER).unwrap();
    s.set_rcvtimeo(5000).unwrap();
    s.connect(&endpoint).unwrap();
    for junk in [&b"{"[..], b"", &[0xff; 100][..], &vec![b'x'; 10_000][..]] {
        s.send(junk, 0).unwrap();
        let reply = s.recv_bytes(0).expect("a reply to every request");
        match crate::exchange::Reply::decode(&reply, "b").unwrap() {
            crate::exchange::Reply::Refuse { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    // And the transport still accepts a real writer.
    let mut a = node();
    a.write_done(0, 10, &b, 0, 1);
}

#[test]
fn a_queue_pair_that_cannot_be_made_fails_the_write_and_wakes_the_caller() {
    use crate::wake::readable;
    let (mut a, b) = pair();
    let fd = a.t.wake_fd().unwrap();
    assert!(a.t.poll_completion().is_none());
    a.t.with_device_mut(|d| d.create_errno = Some(libc::ENOMEM));
    a.write(0, 10, &b, 0, 1).unwrap();
    // The side channel's thread makes the queue pair, and says so.
    assert!(readable(fd, 5000));
    match a.t.poll_completion().map(|c| c.result) {
        Some(Err(VerbsError::Verb { verb, errno, peer })) => {
            assert_eq!((verb, errno), (Verb::CreateQp, libc::ENOMEM));
            assert_eq!(peer.as_deref(), Some(b.t.session_id()));
        }
        other => panic!("{other:?}"),
    }
    a.t.with_device_mut(|d| d.create_errno = None);
    a.write_done(0, 10, &b, 0, 2);
}
