//! Connections and their limits: the GID index, the CQ shared across
//! connections, the writers a target keeps and the idle connections a
//! writer keeps, and the wake descriptor.

use tensorferry_core::transport::Transport;
use tensorferry_hostmem::HostPool;

use super::{config, fill, node, node_with, pair, Node};
use crate::conn::ConnState;
use crate::error::VerbsError;
use crate::sim::SimDevice;
use crate::status::WcStatus;
use crate::transport::VerbsTransport;

#[test]
fn the_gid_index_can_be_configured_and_a_missing_one_is_named() {
    let mut c = config();
    c.gid = crate::gid::GidChoice::Index(2);
    let n = node_with(&c, 4096, 4096);
    assert_eq!(n.t.gid().0, 2);
    c.gid = crate::gid::GidChoice::Index(7);
    match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
        Err(e @ VerbsError::NoGid { .. }) => assert!(e.to_string().contains("GID index 7"), "{e}"),
        other => panic!("{other:?}"),
    }
    c.gid = crate::gid::GidChoice::Index(1);
    // A link-local GID has no IPv4 address for the side channel.
    match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
        Err(e @ VerbsError::Port { .. }) => {
            assert!(e.to_string().contains("--verbs-listen"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    c.listen = Some("127.0.0.1".into());
    assert!(VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).is_ok());
    // An IPv6 host (IPoIB fabrics) is bracketed into the endpoint.
    c.listen = Some("::1".into());
    let t = VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c).unwrap();
    assert!(
        t.session_id().contains("@tcp://[::1]:"),
        "{}",
        t.session_id()
    );
    for wildcard in ["tcp://0.0.0.0:*", "tcp://*:*", "tcp://[::]:*"] {
        c.listen = Some(wildcard.into());
        match VerbsTransport::with_device(SimDevice::new([127, 0, 0, 1], 4096), &c) {
            Err(VerbsError::Port { .. }) => {}
            Ok(t) => panic!("{wildcard}: bound {}", t.session_id()),
            Err(e) => panic!("{wildcard}: {e}"),
        }
    }
}

#[test]
fn outstanding_work_stays_within_the_cq_across_connections() {
    let mut c = config();
    c.send_depth = 8;
    let mut device = SimDevice::new([127, 0, 0, 1], 1024);
    device.cq_capacity = 3;
    let mut t = VerbsTransport::with_device(device, &c).unwrap();
    let pool = HostPool::new(1 << 20).unwrap();
    // SAFETY: the pool moves into `a` behind the transport, so it is
    // unmapped after the transport (and its registration) is gone.
    let region = unsafe { t.register(pool.ptr(), pool.len()) }.unwrap();
    let mut a = Node { t, pool, region };
    fill(a.bytes_mut(), 3);
    let (b, d) = (node(), node());
    let mut n = 0;
    for round in 0..10u64 {
        for (k, to) in [&b, &d].into_iter().enumerate() {
            // 20 KiB in 1 KiB chunks: 20 work requests per write.
            let off = round * 40_000 + k as u64 * 20_000;
            a.write(off, 20_000, to, off, n).unwrap();
            n += 1;
        }
    }
    for c in a.wait(n as usize) {
        assert!(c.result.is_ok(), "{:?}", c.result);
    }
    assert!(b.bytes()[..400_000]
        .chunks(40_000)
        .zip(a.bytes().chunks(40_000))
        .all(|(x, y)| x[..20_000] == y[..20_000]));
    assert!(d.bytes()[..400_000]
        .chunks(40_000)
        .zip(a.bytes().chunks(40_000))
        .all(|(x, y)| x[20_000..] == y[20_000..]));
    let peak = a.t.with_device_mut(|dev| dev.cq_peak);
    assert!(peak <= 3, "{peak} completions waited in a CQ of 3");
}

#[test]
fn a_target_keeps_its_newest_writers_and_an_evicted_one_reconnects() {
    // Both writers dial from 127.0.0.1 without CURVE: one requester. Its
    // queue pairs are bounded by the total, then by its own cap.
    for (max_writers, max_per_writer) in [(1, 64), (4096, 1)] {
        let mut c = config();
        c.max_writers = max_writers;
        c.max_per_writer = max_per_writer;
        let b = node_with(&c, 4096, 1 << 20);
        let (mut a, mut w) = (node(), node());
        a.write_done(0, 10, &b, 0, 1);
        w.write_done(0, 10, &b, 100, 2);
        // `w` took the only place: `a`'s queue pair at `b` is gone.
        assert_eq!(b.t.accepted(), 1);
        a.write(0, 10, &b, 0, 3).unwrap();
        match a.wait(1).remove(0).result {
            Err(VerbsError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RETRY_EXCEEDED)
            }
            other => panic!("{other:?}"),
        }
        a.write(0, 10, &b, 0, 4).unwrap();
        assert!(a.wait(1)[0].result.is_ok(), "reconnected");
        assert_eq!(b.t.accepted(), 1);
    }
}

#[test]
fn a_writer_keeps_at_most_its_limit_of_idle_connections() {
    let mut c = config();
    c.max_writers = 1;
    let mut a = node_with(&c, 4096, 1 << 20);
    let (b, d) = (node(), node());
    a.write_done(0, 10, &b, 0, 1);
    a.write_done(0, 10, &d, 0, 2);
    assert_eq!(
        a.t.connection(b.t.session_id()),
        None,
        "the idle one was closed"
    );
    assert_eq!(a.t.connection(d.t.session_id()), Some(ConnState::Ready));
    a.write_done(0, 10, &b, 0, 3);
    assert_eq!(a.t.with_device_mut(|dev| dev.qps_created), 3);
}

#[test]
fn the_wake_descriptor_rises_for_completions_and_for_side_channel_news() {
    use crate::wake::readable;
    let (mut a, b) = pair();
    let fd = a.t.wake_fd().expect("a wake descriptor");
    // Connect first, then drain: nothing is pending, the CQ is armed.
    a.write_done(0, 10, &b, 0, 1);
    assert!(a.t.poll_completion().is_none());
    assert!(!readable(fd, 0), "quiet when nothing happened");
    a.write(0, 5000, &b, 0, 2).unwrap();
    assert!(readable(fd, 5000), "a completion raises it");
    let c = a.t.poll_completion().expect("the completion");
    assert_eq!(c.cookie, 2);
    assert!(a.t.poll_completion().is_none());
    assert!(!readable(fd, 0), "cleared once reaped");
    // A refusal is found by the side channel's thread: it raises the
    // descriptor without the caller polling.
    a.write_to_stale_incarnation(&b, 3).unwrap();
    assert!(readable(fd, 5000), "news from the side channel raises it");
    match a.t.poll_completion().map(|c| c.result) {
        Some(Err(VerbsError::Refused { .. })) => {}
        other => panic!("{other:?}"),
    }
}
