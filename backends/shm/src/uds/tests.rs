//! The channel end to end over sockets in the temporary directory.

use std::time::{Duration, Instant};

use tensorferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend};

use super::socket::path_of;
use super::{UdsChannel, UdsReceiver};
use crate::error::UdsError;

fn endpoint(tag: &str) -> String {
    format!(
        "ipc://{}/ferry-uds-test-{}-{tag}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    )
}

fn recv_message(rx: &mut UdsReceiver) -> (String, Vec<u8>, Vec<u8>) {
    let mut buf = vec![0u8; 4096];
    for _ in 0..100 {
        if let Some(ChannelEvent::Message(m)) =
            rx.recv(&mut buf, Duration::from_millis(50), None).unwrap()
        {
            return (m.from.to_owned(), m.magic.to_vec(), m.payload.to_vec());
        }
    }
    panic!("no message");
}

#[test]
fn messages_carry_their_sender_and_closing_reports_gone() {
    let (ea, eb) = (endpoint("a"), endpoint("b"));
    let (mut a_tx, a_rx) = UdsChannel::bind(&ea).unwrap().split();
    let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
    a_tx.send(&eb, &[b"__transfer__", b"{\"x\":1}"]).unwrap();
    a_tx.send(&eb, &[b"", b"second"]).unwrap();
    assert_eq!(
        recv_message(&mut b_rx),
        (ea.clone(), b"__transfer__".to_vec(), b"{\"x\":1}".to_vec())
    );
    assert_eq!(
        recv_message(&mut b_rx),
        (ea.clone(), vec![], b"second".to_vec())
    );
    drop(a_tx);
    drop(a_rx);
    let mut buf = vec![0u8; 64];
    let ev = b_rx.recv(&mut buf, Duration::from_secs(2), None).unwrap();
    assert_eq!(ev, Some(ChannelEvent::Gone { from: &ea }));
}

#[test]
fn a_dead_endpoint_is_peer_gone_and_oversize_is_dropped() {
    let (ea, eb) = (endpoint("c"), endpoint("d"));
    let (mut a_tx, _a_rx) = UdsChannel::bind(&ea).unwrap().split();
    let e = a_tx.send(&endpoint("nobody"), &[b"", b"x"]);
    assert!(matches!(e, Err(UdsError::PeerGone { .. })), "{e:?}");
    let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
    a_tx.send(&eb, &[b"", &[7u8; 1000]]).unwrap();
    a_tx.send(&eb, &[b"", b"ok"]).unwrap();
    let mut small = vec![0u8; 100];
    let mut saw_too_large = false;
    for _ in 0..10 {
        match b_rx.recv(&mut small, Duration::from_millis(100), None) {
            Err(UdsError::TooLarge { len: 1002, .. }) => saw_too_large = true,
            Ok(Some(ChannelEvent::Message(m))) => {
                assert_eq!(m.payload, b"ok");
                break;
            }
            other => assert!(matches!(other, Ok(None)), "{other:?}"),
        }
    }
    assert!(saw_too_large);
    assert!(matches!(
        path_of("tcp://1.2.3.4:5"),
        Err(UdsError::BadEndpoint { .. })
    ));
}

#[test]
fn a_readable_wake_descriptor_ends_the_wait_and_messages_still_come() {
    let (ea, eb) = (endpoint("w1"), endpoint("w2"));
    let (mut a_tx, _a_rx) = UdsChannel::bind(&ea).unwrap().split();
    let (_b_tx, mut b_rx) = UdsChannel::bind(&eb).unwrap().split();
    let wake = tensorferry_hostmem::EventFd::new().unwrap();
    let fd = wake.fd();
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    assert!(b_rx
        .recv(&mut buf, Duration::from_millis(50), Some(fd))
        .unwrap()
        .is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(45),
        "waited the time out"
    );
    wake.signal();
    let t = Instant::now();
    assert!(b_rx
        .recv(&mut buf, Duration::from_secs(10), Some(fd))
        .unwrap()
        .is_none());
    assert!(t.elapsed() < Duration::from_secs(5), "woken, not timed out");
    a_tx.send(&eb, &[b"m", b"p"]).unwrap();
    let mut got = None;
    for _ in 0..100 {
        if let Some(ChannelEvent::Message(m)) = b_rx
            .recv(&mut buf, Duration::from_millis(50), Some(fd))
            .unwrap()
        {
            got = Some(m.payload.to_vec());
            break;
        }
    }
    assert_eq!(got.as_deref(), Some(&b"p"[..]));
}

#[test]
fn a_live_endpoint_cannot_be_taken() {
    let e = endpoint("e");
    let _first = UdsChannel::bind(&e).unwrap();
    assert!(UdsChannel::bind(&e).is_err());
}
