//! A peer that stops reading its notifications: the sends to it fail
//! within the bound the API states, the engine's other peers and
//! transfers go on, and what was sent arrives, in order, once it reads.

use std::time::{Duration, Instant};

use tensorferry::core::transport::FaultKind;
use tensorferry::engine::{Op, TransferState, NOTIFY_BACKLOG, NOTIFY_WAIT};

use super::{expect_pattern, local, Buf, Pair, WAIT};

/// `session` naming its inbox's host `127.0.0.1` as `127.1` (the same
/// address to the resolver), which its Unix name is not bound under: a
/// sender of this host reaches it by TCP, as one of another host would.
pub(super) fn by_tcp(session: &str) -> String {
    let by_tcp = session.replace("|tcp://127.0.0.1:", "|tcp://127.1:");
    assert_ne!(by_tcp, session, "{session}");
    by_tcp
}

#[test]
fn a_peer_that_reads_nothing_fails_only_the_sends_to_it_by_unix_socket() {
    reads_nothing(false);
}

#[test]
fn a_peer_that_reads_nothing_fails_only_the_sends_to_it_by_tcp() {
    reads_nothing(true);
}

fn reads_nothing(tcp: bool) {
    // `b` reads nothing until the end; `other` reads all along.
    let p = Pair::of(local(), local());
    let other = local();
    let other_mem = Buf::new(4096);
    // SAFETY: `other_mem` outlives `other` (dropped first, below).
    unsafe { other.register(other_mem.addr(), 4096).unwrap() };
    let to_b = if tcp {
        by_tcp(&p.b.session_id())
    } else {
        p.b.session_id()
    };
    let note = |i: usize| (i as u32).to_le_bytes().repeat(1024);

    // Until its outbox is full, sends to `b` return at once; then one
    // waits NOTIFY_WAIT for room and fails.
    let mut sent = 0usize;
    let error = loop {
        match p.a.notify(&to_b, &note(sent)) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(
            sent < 4096,
            "16 MiB of notifications taken by a peer that reads none"
        );
    };
    assert_eq!(error.kind(), FaultKind::Timeout, "{error}");
    assert!(error.to_string().contains("reads none"), "{error}");
    assert!(
        sent * 4096 >= NOTIFY_BACKLOG,
        "full after {sent} notifications"
    );

    // A transfer to it with a notification attached (as long as the one
    // that found no room) fails at once (the thread that sends it drives
    // every other transfer), its bytes there;
    // a transfer to the other peer, and its notification, go through.
    let started = Instant::now();
    p.mem_a.fill(0, 4096, 3);
    let e = loop {
        // What the peer's socket drained meanwhile may take one or two.
        let t =
            p.a.post_write(&to_b, &[p.op(0, 0, 4096)], WAIT, Some(&note(sent)))
                .unwrap();
        match t.wait(WAIT) {
            Ok(state) => {
                assert_eq!(state, TransferState::Done);
                sent += 1;
            }
            Err(e) => break e,
        }
        assert!(
            started.elapsed() < NOTIFY_WAIT / 2,
            "attached notifications to a full peer go on"
        );
    };
    assert_eq!(e.kind(), FaultKind::Timeout, "{e}");
    assert!(expect_pattern(&p.mem_b.bytes()[..4096], 3));
    let op = Op {
        src: p.mem_a.addr(),
        dst: other_mem.addr(),
        len: 4096,
    };
    p.a.post_write(&other.session_id(), &[op], WAIT, Some(b"to other"))
        .unwrap()
        .finish()
        .unwrap();
    let until = Instant::now() + WAIT;
    let got = loop {
        let got = other.notifications().unwrap();
        if !got.is_empty() || Instant::now() > until {
            break got;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message, b"to other");
    assert!(expect_pattern(&other_mem.0, 3));
    assert!(
        started.elapsed() < NOTIFY_WAIT / 2,
        "the attached notification or the other peer's transfer waited on the full peer"
    );

    // Once it reads, every notification that was taken arrives, in order,
    // and it takes notifications again.
    let got = p.notifications(sent, |_| {});
    assert!(
        got.iter().enumerate().all(|(i, m)| *m == note(i)),
        "out of order"
    );
    p.a.notify(&to_b, b"again").unwrap();
    assert_eq!(p.notifications(1, |_| {}), [b"again".to_vec()]);
    drop(other);
}

#[test]
fn a_peer_gone_fails_the_sends_to_it_and_no_other() {
    for tcp in [false, true] {
        gone(tcp);
    }
}

fn gone(tcp: bool) {
    let p = Pair::of(local(), local());
    let gone = local();
    let to_gone = if tcp {
        by_tcp(&gone.session_id())
    } else {
        gone.session_id()
    };
    p.a.notify(&to_gone, b"before").unwrap();
    drop(gone);
    // The connection's end reaches the sender with its next writes.
    let until = Instant::now() + WAIT;
    let error = loop {
        match p.a.notify(&to_gone, b"after") {
            Ok(()) => assert!(Instant::now() < until, "sends to a closed engine go on"),
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(error.kind(), FaultKind::PeerGone, "{error}");
    p.a.notify(&p.b.session_id(), b"still here").unwrap();
    assert_eq!(p.notifications(1, |_| {}), [b"still here".to_vec()]);
}
