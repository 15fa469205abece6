//! The whole API on each data plane (transfers with handles from many
//! threads, polled transfers, reads, notifications alone), and 100,000
//! notifications, none lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensorferry::core::transport::{FaultKind, OutsideOwnRegions};
use tensorferry::engine::{EngineError, Op, TransferState, MAX_NOTIFICATION};

#[cfg(feature = "fabric")]
use super::fabric;
#[cfg(feature = "verbs-sim")]
use super::sim;
use super::slow_peer::by_tcp;
use super::{expect_pattern, local, Pair, MEM, WAIT};

/// Threads post transfers with notifications attached and wait for them;
/// every byte lands, and each notification arrives only once its
/// transfer's bytes are in the peer's memory.
fn transfers_from_many_threads(p: &Pair) {
    const THREADS: usize = 4;
    const EACH: usize = 16;
    const PART: usize = 16 << 10;
    const OPS: usize = 4;
    let span = PART * OPS;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let mut posted = Vec::new();
                for i in 0..EACH {
                    let at = (t * EACH + i) * span;
                    p.mem_a.fill(at, span, (t * EACH + i) as u32);
                    let ops: Vec<Op> = (0..OPS)
                        .map(|k| p.op(at + k * PART, at + k * PART, PART))
                        .collect();
                    let note = format!("{t}:{i}");
                    posted.push(
                        p.a.post_write(&p.b.session_id(), &ops, WAIT, Some(note.as_bytes()))
                            .unwrap(),
                    );
                }
                for x in posted {
                    x.finish().unwrap();
                }
            });
        }
    });
    let notes = p.notifications(THREADS * EACH, |m| {
        let text = std::str::from_utf8(m).unwrap();
        let (t, i) = text.split_once(':').unwrap();
        let n = t.parse::<usize>().unwrap() * EACH + i.parse::<usize>().unwrap();
        let at = n * span;
        assert!(
            expect_pattern(&p.mem_b.bytes()[at..at + span], n as u32),
            "notification {text} arrived before its bytes"
        );
    });
    let mut notes: Vec<String> = notes
        .into_iter()
        .map(|m| String::from_utf8(m).unwrap())
        .collect();
    notes.sort();
    notes.dedup();
    assert_eq!(notes.len(), THREADS * EACH, "a notification twice");
}

/// A transfer polled without waiting reaches `Done`; one waited on for no
/// time says where it stands.
fn polled_transfer(p: &Pair) {
    p.mem_a.fill(0, 1 << 20, 7);
    let x =
        p.a.post_write(&p.b.session_id(), &[p.op(0, 0, 1 << 20)], WAIT, None)
            .unwrap();
    let until = Instant::now() + WAIT;
    while x.state() == TransferState::Pending {
        assert!(Instant::now() < until, "never done");
        std::thread::yield_now();
    }
    assert_eq!(x.state(), TransferState::Done);
    assert_eq!(x.wait(Duration::ZERO).unwrap(), TransferState::Done);
    x.release().unwrap();
    assert!(expect_pattern(&p.mem_b.bytes()[..1 << 20], 7));
}

/// Reads bring the peer's bytes, synchronously and with a handle, and are
/// checked at both ends as writes are.
fn reads(p: &Pair) {
    let peer = p.b.session_id();
    let len = 3 << 20;
    p.mem_b.fill(MEM - len, len, 11);
    p.a.read(&peer, &[p.read_op(MEM - len, 0, len)], WAIT)
        .unwrap();
    assert!(expect_pattern(&p.mem_a.bytes()[..len], 11));
    // Small reads in one batch, with a handle.
    p.mem_b.fill(0, 4096, 12);
    let ops: Vec<Op> = (0..16)
        .map(|k| p.read_op(k * 256, (1 << 20) + k * 256, 256))
        .collect();
    let x = p.a.post_read(&peer, &ops, WAIT, None).unwrap();
    assert_eq!(x.wait(WAIT).unwrap(), TransferState::Done);
    x.release().unwrap();
    assert!(expect_pattern(
        &p.mem_a.bytes()[1 << 20..(1 << 20) + 4096],
        12
    ));
    // Outside the peer's registered memory.
    let e =
        p.a.read(&peer, &[p.read_op(MEM - 1, 0, 2)], WAIT)
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::OutOfBounds, "{e}");
    // Into memory this engine did not register: refused before posting.
    let e =
        p.a.read(&peer, &[p.read_op(0, MEM - 1, 2)], WAIT)
            .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::OutsideOwn(OutsideOwnRegions { read: true, .. })
        ),
        "{e}"
    );
    // A read with a notification: the peer hears of it once done.
    let x =
        p.a.post_read(&peer, &[p.read_op(0, 0, 64)], WAIT, Some(b"read"))
            .unwrap();
    x.finish().unwrap();
    assert_eq!(p.notifications(1, |_| {}), vec![b"read".to_vec()]);
}

/// Notifications alone: in the order sent; refused when too long or when
/// the session id names no inbox.
fn notifications_alone(p: &Pair) {
    let peer = p.b.session_id();
    for i in 0..100u32 {
        p.a.notify(&peer, &i.to_le_bytes()).unwrap();
    }
    let got = p.notifications(100, |_| {});
    let order: Vec<u32> = got
        .iter()
        .map(|m| u32::from_le_bytes(m[..4].try_into().unwrap()))
        .collect();
    assert_eq!(order, (0..100).collect::<Vec<_>>());
    p.a.notify(&peer, &vec![0; MAX_NOTIFICATION]).unwrap();
    assert_eq!(p.notifications(1, |_| {})[0].len(), MAX_NOTIFICATION);
    let e =
        p.a.notify(&peer, &vec![0; MAX_NOTIFICATION + 1])
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::TooLarge, "{e}");
    let bare = peer.rsplit_once('|').unwrap().0;
    let e = p.a.notify(bare, b"x").unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
    // Transfers still reach a bare session id; a notification attached
    // to one is refused before anything is posted.
    p.a.write(bare, &[p.op(0, 0, 8)], WAIT).unwrap();
    let e =
        p.a.post_write(bare, &[p.op(0, 0, 8)], WAIT, Some(b"x"))
            .unwrap_err();
    assert_eq!(e.kind(), FaultKind::UnknownPeer, "{e}");
}

fn exercise(p: &Pair) {
    transfers_from_many_threads(p);
    polled_transfer(p);
    reads(p);
    notifications_alone(p);
    assert!(p.b.notifications().unwrap().is_empty());
}

#[test]
fn local_engines_offer_the_whole_api() {
    exercise(&Pair::of(local(), local()));
}

#[cfg(feature = "fabric")]
#[test]
fn fabric_engines_offer_the_whole_api_over_tcp() {
    exercise(&Pair::of(fabric("tcp;ofi_rxm"), fabric("tcp;ofi_rxm")));
}

#[cfg(feature = "verbs-sim")]
#[test]
fn verbs_engines_offer_the_whole_api_on_the_stand_in() {
    exercise(&Pair::of(sim::engine().0, sim::engine().0));
}

/// 100,000 notifications, alone and attached to transfers, from two
/// threads, while the receiver reads them: none is lost or repeated, and
/// each thread's arrive in the order it sent them.
#[test]
fn none_of_100_000_notifications_is_lost() {
    none_lost(false);
}

/// As [`none_of_100_000_notifications_is_lost`], by TCP (as between
/// hosts) rather than the inbox's Unix name.
#[test]
fn none_of_100_000_notifications_by_tcp_is_lost() {
    none_lost(true);
}

fn none_lost(tcp: bool) {
    const N: u32 = 100_000;
    const THREADS: u32 = 2;
    let p = Pair::of(local(), local());
    let peer = if tcp {
        by_tcp(&p.b.session_id())
    } else {
        p.b.session_id()
    };
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (p, peer) = (&p, &peer);
            s.spawn(move || {
                for i in 0..N / THREADS {
                    let mut m = [0u8; 8];
                    m[..4].copy_from_slice(&t.to_le_bytes());
                    m[4..].copy_from_slice(&i.to_le_bytes());
                    if i % 100 == 0 {
                        // Attached: sent before the transfer is final, so
                        // it keeps its place in the thread's order.
                        let op = p.op(t as usize * 64, t as usize * 64, 64);
                        p.a.post_write(peer, &[op], WAIT, Some(&m))
                            .unwrap()
                            .finish()
                            .unwrap();
                    } else {
                        p.a.notify(peer, &m).unwrap();
                    }
                }
            });
        }
        s.spawn(|| {
            let mut next = [0u32; THREADS as usize];
            let mut seen = 0;
            let until = Instant::now() + Duration::from_secs(120);
            while seen < N {
                assert!(Instant::now() < until, "{seen} of {N} notifications");
                let got = p.b.notifications().unwrap();
                if got.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                }
                for note in got {
                    let t = u32::from_le_bytes(note.message[..4].try_into().unwrap());
                    let i = u32::from_le_bytes(note.message[4..].try_into().unwrap());
                    assert_eq!(
                        i, next[t as usize],
                        "thread {t}'s notifications out of order"
                    );
                    next[t as usize] += 1;
                    seen += 1;
                }
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    assert!(done.load(Ordering::Relaxed));
    assert!(p.b.notifications().unwrap().is_empty());
}

/// The notification descriptor: a reader that waits on it wakes when a
/// notification comes (by Unix socket and by TCP), finds it, and after
/// taking everything it no longer polls readable.
#[test]
fn a_reader_waits_on_the_notification_descriptor() {
    use std::os::fd::AsRawFd;
    let readable = |e: &tensorferry::engine::TransferEngine, ms: i32| {
        let mut p = libc::pollfd {
            fd: e.notification_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on a descriptor the engine keeps open.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    let p = Pair::of(local(), local());
    for to in [p.b.session_id(), by_tcp(&p.b.session_id())] {
        assert!(!readable(&p.b, 0), "readable with nothing sent");
        let waiter = std::thread::scope(|s| {
            let w = s.spawn(|| readable(&p.b, 20_000));
            std::thread::sleep(Duration::from_millis(50));
            p.a.notify(&to, b"wake").unwrap();
            w.join().unwrap()
        });
        assert!(waiter, "the descriptor did not wake its reader");
        // The connection may come ready before its first notification.
        let until = Instant::now() + WAIT;
        let got = loop {
            let got = p.b.notifications().unwrap();
            if !got.is_empty() || Instant::now() > until {
                break got;
            }
            assert!(readable(&p.b, 1000) || Instant::now() > until);
        };
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message, b"wake");
        assert!(!readable(&p.b, 0), "readable once everything was taken");
    }
}
