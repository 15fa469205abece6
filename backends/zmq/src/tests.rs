//! The channel end to end over loopback TCP and IPC sockets.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend};

use crate::{zmq, ZmqChannel, ZmqConfig, ZmqReceiver};

fn next(rx: &mut ZmqReceiver, buf: &mut [u8]) -> (String, Vec<u8>, Vec<u8>) {
    for _ in 0..100 {
        match rx.recv(buf, Duration::from_millis(50), None) {
            Ok(Some(ChannelEvent::Message(m))) => {
                return (m.via.to_owned(), m.magic.to_vec(), m.payload.to_vec())
            }
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    panic!("nothing arrived");
}

#[test]
fn an_allow_list_lets_only_its_addresses_through_and_finds_ghosts() {
    let ctx = zmq::Context::new();
    let allowed: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let (_own, mut rx) = ZmqChannel::bind_allowing(
        &ctx,
        &["tcp://127.0.0.1:*"],
        ZmqConfig::default(),
        &[allowed],
    )
    .unwrap()
    .split();
    let ep = rx.endpoints()[0].clone();
    let other = zmq::Context::new();
    let (mut tx, mut tx_events) =
        ZmqChannel::bind(&other, &["tcp://127.0.0.1:*"], ZmqConfig::default())
            .unwrap()
            .split();
    // The same receiver, reached from 127.0.0.1 (not on the list) and
    // from 127.0.0.2 (libzmq's `source;destination` form).
    let from_listed = format!("tcp://127.0.0.2:0;{}", ep.trim_start_matches("tcp://"));
    let mut buf = vec![0u8; 256];
    for _ in 0..5 {
        tx.send(&ep, &[b"__transfer__", b"forged"]).unwrap();
    }
    tx.send(&from_listed, &[b"__transfer__", b"listed"])
        .unwrap();
    let (_, _, payload) = next(&mut rx, &mut buf);
    assert_eq!(payload, b"listed");
    // Nothing else comes: the refused connection's messages never do.
    for _ in 0..10 {
        match rx.recv(&mut buf, Duration::from_millis(50), None) {
            Ok(Some(ChannelEvent::Message(m))) => panic!("{:?} got through", m.payload),
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    // A peer nobody serves is reported gone once its first connection
    // fails (a registration naming a ghost endpoint).
    tx.send("tcp://127.0.0.1:1", &[b"__transfer__", b"to nobody"])
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match tx_events.recv(&mut buf, Duration::from_millis(50), None) {
            Ok(Some(ChannelEvent::Gone {
                from: "tcp://127.0.0.1:1",
            })) => break,
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < end,
            "the unserved endpoint was not reported"
        );
    }
}

#[test]
fn a_readable_descriptor_wakes_the_receiver() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let ctx = zmq::Context::new();
    let (_tx, mut rx) = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default())
        .unwrap()
        .split();
    let (r, mut w) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut buf = vec![0u8; 64];
    w.write_all(b"x").unwrap();
    let t = Instant::now();
    assert!(rx
        .recv(&mut buf, Duration::from_secs(10), Some(r.as_raw_fd()))
        .unwrap()
        .is_none());
    assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
}

#[test]
fn frames_arrive_with_the_endpoint_they_came_in_at() {
    let ctx = zmq::Context::new();
    let (mut a, _a_rx) = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default())
        .unwrap()
        .split();
    let ipc = format!(
        "ipc://{}/ferry-zmq-unit-{}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    );
    let b = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*", &ipc], ZmqConfig::default()).unwrap();
    let eps = b.endpoints();
    let (_b_tx, mut b_rx) = b.split();
    let mut buf = vec![0u8; 1024];
    a.send(&eps[0], &[b"__transfer__", b"{}"]).unwrap();
    assert_eq!(
        next(&mut b_rx, &mut buf),
        (eps[0].clone(), b"__transfer__".to_vec(), b"{}".to_vec())
    );
    a.send(&eps[1], &[b"work", b"item"]).unwrap();
    assert_eq!(
        next(&mut b_rx, &mut buf),
        (eps[1].clone(), b"work".to_vec(), b"item".to_vec())
    );
}

#[test]
fn a_dropped_channel_removes_the_files_of_its_ipc_endpoints() {
    let ctx = zmq::Context::new();
    let path = std::env::temp_dir().join(format!("ferry-zmq-drop-{}.sock", std::process::id()));
    let ep = format!("ipc://{}", path.display());
    let ch = ZmqChannel::bind(&ctx, &[&ep], ZmqConfig::default()).unwrap();
    assert!(path.exists(), "bound at {ep}");
    let (tx, rx) = ch.split();
    drop(tx);
    assert!(path.exists(), "the receiving side still listens");
    drop(rx);
    assert!(!path.exists(), "{ep} left behind");
}

#[test]
fn bad_frames_are_errors_and_the_channel_goes_on() {
    let ctx = zmq::Context::new();
    let b = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default()).unwrap();
    let ep = b.endpoints()[0].clone();
    let (_b_tx, mut b_rx) = b.split();
    let raw = ctx.socket(zmq::PUSH).unwrap();
    raw.connect(&ep).unwrap();
    raw.send(&b"__transfer__"[..], 0).unwrap();
    raw.send(vec![b'x'; 5000], 0).unwrap();
    raw.send_multipart([&b"__transfer__"[..], &[b'y'; 5000][..]], 0)
        .unwrap();
    raw.send_multipart([&b"__transfer__"[..], b"{}", b"extra"], 0)
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let mut errors = Vec::new();
    let mut ok = None;
    for _ in 0..50 {
        match b_rx.recv(&mut buf, Duration::from_millis(50), None) {
            Ok(Some(ChannelEvent::Message(m))) => {
                ok = Some((m.magic.to_vec(), m.payload.to_vec()));
                break;
            }
            Ok(_) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert_eq!(ok, Some((b"__transfer__".to_vec(), b"{}".to_vec())));
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("without its second frame"), "{errors:?}");
    assert!(errors[1].contains("5000 bytes"), "{errors:?}");
    assert!(errors[2].contains("5012 bytes"), "{errors:?}");
}

#[test]
fn a_peer_that_goes_away_is_reported_gone() {
    let ctx = zmq::Context::new();
    let (mut a, mut a_rx) = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default())
        .unwrap()
        .split();
    let b = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default()).unwrap();
    let ep = b.endpoints()[0].clone();
    let (b_tx, mut b_rx) = b.split();
    let mut buf = vec![0u8; 1024];
    a.send(&ep, &[b"__transfer__", b"{}"]).unwrap();
    next(&mut b_rx, &mut buf);
    drop((b_tx, b_rx));
    let mut gone = None;
    for _ in 0..100 {
        if let Ok(Some(ChannelEvent::Gone { from })) =
            a_rx.recv(&mut buf, Duration::from_millis(50), None)
        {
            gone = Some(from.to_owned());
            break;
        }
    }
    assert_eq!(gone, Some(ep));
}
