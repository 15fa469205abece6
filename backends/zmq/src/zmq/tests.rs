//! The binding against the libzmq it links: sockets over inproc and tcp
//! loopback, errors, messages and their metadata under CURVE, polling and
//! monitoring.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::*;
use crate::curve::CurvePublicKey;
use crate::zap::{Policy, ZapHandler, DOMAIN};

/// A PUSH socket connected to a PULL socket bound at `endpoint` (port 0
/// chosen on tcp); the PULL first, and the bound endpoint.
fn pair(ctx: &Context, endpoint: &str) -> (Socket, Socket, String) {
    let pull = ctx.socket(PULL).unwrap();
    pull.set_linger(0).unwrap();
    pull.bind(endpoint).unwrap();
    let bound = pull.get_last_endpoint().unwrap().unwrap();
    let push = ctx.socket(PUSH).unwrap();
    push.set_linger(0).unwrap();
    push.connect(&bound).unwrap();
    (pull, push, bound)
}

#[test]
fn frames_and_messages_travel_over_inproc() {
    let ctx = Context::new();
    let (pull, push, bound) = pair(&ctx, "inproc://binding-inproc");
    assert_eq!(bound, "inproc://binding-inproc");
    push.send(b"one", 0).unwrap();
    push.send(vec![2u8; 3], 0).unwrap();
    push.send("three", 0).unwrap();
    push.send_multipart([&b"four"[..], b"", b"six"], 0).unwrap();
    assert_eq!(pull.recv_bytes(0).unwrap(), b"one");
    let msg = pull.recv_msg(0).unwrap();
    assert_eq!((&msg[..], msg.get_more()), (&[2u8; 3][..], false));
    let mut buf = [0u8; 8];
    assert_eq!(pull.recv_into(&mut buf, 0).unwrap(), 5);
    assert_eq!(&buf[..5], b"three");
    let parts = pull.recv_multipart(0).unwrap();
    assert_eq!(parts, [b"four".to_vec(), Vec::new(), b"six".to_vec()]);
    assert!(!pull.get_rcvmore().unwrap());
}

#[test]
fn a_frame_larger_than_the_buffer_is_truncated_and_its_length_said() {
    let ctx = Context::new();
    let (pull, push, _) = pair(&ctx, "inproc://binding-truncate");
    push.send_multipart([vec![7u8; 5000], vec![8u8; 2]], 0)
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(pull.recv_into(&mut buf, 0).unwrap(), 5000);
    assert_eq!(buf, [7u8; 16]);
    assert!(pull.get_rcvmore().unwrap());
    assert_eq!(pull.recv_into(&mut buf, 0).unwrap(), 2);
}

#[test]
fn tcp_loopback_resolves_port_zero_and_names_the_peer() {
    let ctx = Context::new();
    let (pull, push, bound) = pair(&ctx, "tcp://127.0.0.1:*");
    assert!(bound.starts_with("tcp://127.0.0.1:"), "{bound}");
    assert_ne!(bound, "tcp://127.0.0.1:0");
    push.send_multipart(["a", "b"], 0).unwrap();
    pull.set_rcvtimeo(5000).unwrap();
    let first = pull.recv_msg(0).unwrap();
    assert_eq!(&first[..], b"a");
    assert!(first.get_more());
    assert_eq!(first.gets("Peer-Address"), Some("127.0.0.1"));
    assert_eq!(first.gets("No-Such-Property"), None);
    assert_eq!(first.gets("Peer\0Address"), None);
    assert_eq!(pull.recv_bytes(0).unwrap(), b"b");
    // A second bind of the same port is refused, and named.
    let other = ctx.socket(PULL).unwrap();
    assert_eq!(other.bind(&bound), Err(Error::EADDRINUSE));
}

#[test]
fn dontwait_on_an_empty_queue_is_eagain() {
    let ctx = Context::new();
    let (pull, _push, _) = pair(&ctx, "inproc://binding-eagain");
    assert_eq!(pull.recv_bytes(DONTWAIT), Err(Error::EAGAIN));
    assert_eq!(pull.recv_into(&mut [0; 4], DONTWAIT), Err(Error::EAGAIN));
    let mut msg = Message::new();
    assert_eq!(pull.recv(&mut msg, DONTWAIT), Err(Error::EAGAIN));
    assert!(msg.is_empty());
    // A receive timeout ends in the same error.
    pull.set_rcvtimeo(10).unwrap();
    assert_eq!(pull.recv_bytes(0), Err(Error::EAGAIN));
    // A PUSH with no peer has no room.
    let lone = ctx.socket(PUSH).unwrap();
    assert_eq!(lone.send("x", DONTWAIT), Err(Error::EAGAIN));
}

#[test]
fn bad_endpoints_and_options_are_errors_not_panics() {
    let ctx = Context::new();
    let s = ctx.socket(PAIR).unwrap();
    assert_eq!(s.bind("inproc://with\0nul"), Err(Error::EINVAL));
    assert_eq!(s.connect("tcp://with\0nul"), Err(Error::EINVAL));
    assert_eq!(s.bind("nosuch://x"), Err(Error::EPROTONOSUPPORT));
    assert_eq!(s.connect("tcp://"), Err(Error::EINVAL));
    assert_eq!(s.set_curve_publickey(&[1; 7]), Err(Error::EINVAL));
    assert_eq!(s.unbind("inproc://never-bound"), Err(Error::ENOENT));
}

#[test]
fn a_long_last_endpoint_is_read_whole() {
    let ctx = Context::new();
    let name = format!("inproc://{}", "n".repeat(3000));
    let s = ctx.socket(PAIR).unwrap();
    s.bind(&name).unwrap();
    assert_eq!(s.get_last_endpoint().unwrap().unwrap(), name);
}

#[test]
fn sockets_keep_their_context_and_move_between_threads() {
    let (pull, push) = {
        let ctx = Context::new();
        let (pull, push, _) = pair(&ctx, "inproc://binding-outlive");
        (pull, push)
        // The last Context value drops here; the sockets keep it.
    };
    let sent = std::thread::spawn(move || push.send("moved", 0)).join();
    assert!(matches!(sent, Ok(Ok(()))));
    assert_eq!(pull.recv_bytes(0).unwrap(), b"moved");
    // Clones share one context: inproc names are per context.
    let ctx = Context::new();
    let twin = ctx.clone();
    let a = ctx.socket(PAIR).unwrap();
    a.bind("inproc://binding-shared").unwrap();
    let b = twin.socket(PAIR).unwrap();
    b.connect("inproc://binding-shared").unwrap();
    b.send("hi", 0).unwrap();
    assert_eq!(a.recv_bytes(0).unwrap(), b"hi");
    assert_eq!(
        Context::new()
            .socket(PAIR)
            .unwrap()
            .connect("inproc://binding-shared"),
        Ok(()),
        "connecting before a bind is allowed"
    );
}

#[test]
fn poll_waits_on_sockets_and_file_descriptors() {
    let ctx = Context::new();
    let (pull, push, _) = pair(&ctx, "inproc://binding-poll");
    let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
    {
        let mut items = [
            pull.as_poll_item(POLLIN),
            PollItem::from_fd(rx.as_raw_fd(), POLLIN),
        ];
        assert_eq!(poll(&mut items, 0).unwrap(), 0);
        assert!(!items[0].is_readable() && !items[1].is_readable());
    }
    tx.write_all(b"x").unwrap();
    push.send("y", 0).unwrap();
    let mut items = [
        pull.as_poll_item(POLLIN),
        PollItem::from_fd(rx.as_raw_fd(), POLLIN),
    ];
    assert_eq!(poll(&mut items, 1000).unwrap(), 2);
    assert!(items.iter().all(PollItem::is_readable));
    assert!(pull.get_events().unwrap().contains(POLLIN));
    assert_eq!(pull.poll(POLLIN, 0).unwrap(), 1);
    assert!(push.get_events().unwrap().contains(POLLOUT));
    assert!(pull.get_fd().unwrap() >= 0);
}

/// The next event the monitor at `watch` reports, waiting up to 5 s.
fn next_event(watch: &Socket) -> Option<SocketEvent> {
    if watch.poll(POLLIN, 5000).ok()? == 0 {
        return None;
    }
    let frames = watch.recv_multipart(0).ok()?;
    let event = MonitorEvent::parse(frames.first()?)?;
    event.event()
}

#[test]
fn a_monitor_reports_connection_and_loss() {
    let ctx = Context::new();
    let pull = ctx.socket(PULL).unwrap();
    pull.set_linger(0).unwrap();
    pull.bind("tcp://127.0.0.1:*").unwrap();
    let bound = pull.get_last_endpoint().unwrap().unwrap();
    let push = ctx.socket(PUSH).unwrap();
    push.set_linger(0).unwrap();
    let events = SocketEvent::CONNECTED as i32 | SocketEvent::DISCONNECTED as i32;
    push.monitor("inproc://binding-monitor", events).unwrap();
    let watch = ctx.socket(PAIR).unwrap();
    watch.connect("inproc://binding-monitor").unwrap();
    push.connect(&bound).unwrap();
    assert_eq!(next_event(&watch), Some(SocketEvent::CONNECTED));
    drop(pull);
    assert_eq!(next_event(&watch), Some(SocketEvent::DISCONNECTED));
}

#[test]
fn monitor_frames_parse_and_unknown_events_are_none() {
    let mut frame = Vec::new();
    frame.extend_from_slice(&(SocketEvent::CONNECT_RETRIED as u16).to_ne_bytes());
    frame.extend_from_slice(&250u32.to_ne_bytes());
    let e = MonitorEvent::parse(&frame).unwrap();
    assert_eq!(
        (e.event(), e.value),
        (Some(SocketEvent::CONNECT_RETRIED), 250)
    );
    assert_eq!(MonitorEvent::parse(&frame[..5]), None);
    assert_eq!(SocketEvent::from_raw(0x8000), None);
    assert_eq!(SocketEvent::from_raw(0xFFFF), None);
    assert_eq!(
        SocketEvent::from_raw(0x0200),
        Some(SocketEvent::DISCONNECTED)
    );
}

#[test]
fn this_libzmq_has_curve_and_makes_keys() {
    assert_eq!(has("curve"), Some(true));
    assert_eq!(has("ipc"), Some(true));
    assert_eq!(has("no-such-capability"), Some(false));
    assert_eq!(has("cur\0ve"), None);
    let a = CurveKeyPair::new().unwrap();
    let b = CurveKeyPair::new().unwrap();
    assert_ne!(a.public_key, b.public_key);
    assert_ne!(a.secret_key, [0; 32]);
    let shown = format!("{a:?}");
    assert!(!shown.contains(&format!("{:?}", a.secret_key)), "{shown}");
    assert_eq!(version().0, 4);
}

#[test]
fn errors_round_trip_and_read_as_libzmq_says() {
    for raw in [libc::EAGAIN, libc::EINTR, sys::ETERM, sys::EFSM, 9999] {
        assert_eq!(Error::from_raw(raw).to_raw(), raw);
    }
    assert_eq!(Error::from_raw(sys::ETERM), Error::ETERM);
    assert_eq!(Error::from_raw(9999), Error::Other(9999));
    assert_eq!(Error::ETERM.to_string(), "Context was terminated");
    assert_eq!(
        Error::EAGAIN.to_string(),
        "Resource temporarily unavailable"
    );
    let io: std::io::Error = Error::EADDRINUSE.into();
    assert_eq!(io.raw_os_error(), Some(libc::EADDRINUSE));
}

/// Waits up to 5 s for a message on `pull`.
fn recv_within(pull: &Socket) -> Option<Message> {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        match pull.recv_msg(DONTWAIT) {
            Ok(m) => return Some(m),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    None
}

#[test]
fn under_curve_a_message_carries_the_key_the_handler_admitted() {
    let ctx = Context::new();
    let server = CurveKeyPair::new().unwrap();
    let client = CurveKeyPair::new().unwrap();
    let stranger = CurveKeyPair::new().unwrap();
    let policy = Policy {
        allow: Vec::new(),
        keys: Some(vec![CurvePublicKey(client.public_key)]),
    };
    let zap = ZapHandler::start(&ctx, policy).unwrap();
    let pull = ctx.socket(PULL).unwrap();
    pull.set_linger(0).unwrap();
    pull.set_curve_server(true).unwrap();
    pull.set_curve_secretkey(&server.secret_key).unwrap();
    pull.set_zap_domain(DOMAIN).unwrap();
    pull.bind("tcp://127.0.0.1:*").unwrap();
    let bound = pull.get_last_endpoint().unwrap().unwrap();
    let connect = |keys: &CurveKeyPair| {
        let push = ctx.socket(PUSH).unwrap();
        push.set_linger(0).unwrap();
        push.set_curve_serverkey(&server.public_key).unwrap();
        push.set_curve_publickey(&keys.public_key).unwrap();
        push.set_curve_secretkey(&keys.secret_key).unwrap();
        push.connect(&bound).unwrap();
        push
    };
    // The stranger's handshake is refused: its message never arrives.
    let refused = connect(&stranger);
    let _ = refused.send("from a stranger", DONTWAIT);
    let admitted = connect(&client);
    admitted.send("from the client", 0).unwrap();
    let msg = recv_within(&pull).expect("the admitted client's message");
    assert_eq!(&msg[..], b"from the client");
    let user = CurvePublicKey(client.public_key).to_z85();
    assert_eq!(msg.gets("User-Id"), Some(user.as_str()));
    assert_eq!(pull.recv_bytes(DONTWAIT), Err(Error::EAGAIN));
    let end = Instant::now() + Duration::from_secs(5);
    while zap.refused() == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(zap.refused() >= 1, "the stranger was refused");
    drop((admitted, refused, pull));
}
