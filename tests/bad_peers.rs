//! A real instance node facing a coordinator that sends what it should not:
//! this test plays the coordinator over a raw Unix socket and checks what
//! the instance answers on the wire.

mod common;
#[path = "common/tensors.rs"]
mod tensors;

use std::time::Duration;

use common::endpoint;
use tensorferry::runtime::{DataPlane, InstanceNode, InstanceNodeConfig};
use tensorferry_core::transport::{ChannelEvent, ControlChannel, ControlRecv, ControlSend};
use tensorferry_core::wire::{decode, Msg, Push, RegisterAck, TRANSFER_MAGIC};
use tensorferry_shm::{UdsChannel, UdsReceiver, UdsSender};
use tensorferry_zmq::zmq;

/// The next transfer message, as (sender, JSON text).
fn next(rx: &mut UdsReceiver) -> (String, String) {
    let mut buf = vec![0u8; 1 << 16];
    for _ in 0..100 {
        if let Some(ChannelEvent::Message(m)) =
            rx.recv(&mut buf, Duration::from_millis(50), None).unwrap()
        {
            assert_eq!(m.magic, TRANSFER_MAGIC);
            return (
                m.from.to_owned(),
                String::from_utf8(m.payload.to_vec()).unwrap(),
            );
        }
    }
    panic!("nothing received");
}

fn send(tx: &mut UdsSender, to: &str, msg: &Msg<'_>) {
    let mut buf = vec![0u8; 4096];
    let n = msg.encode(&mut buf).unwrap();
    tx.send(to, &[TRANSFER_MAGIC, &buf[..n]]).unwrap();
}

/// An encoder registered with this fake coordinator.
fn registered_instance(tx: &mut UdsSender, rx: &mut UdsReceiver) -> (InstanceNode, String) {
    let coord = rx.local_endpoint().to_owned();
    let node = common::instance("encoder", &coord, 16 << 20, "enc");
    let (from, text) = next(rx);
    let Ok(Msg::Register(r)) = decode(text.as_bytes()) else {
        panic!("{text}")
    };
    send(
        tx,
        &from,
        &Msg::RegisterAck(RegisterAck {
            session_id: r.session_id,
            role: r.role,
            accepted: true,
            error: None,
        }),
    );
    node.wait_registered(Duration::from_secs(5)).unwrap();
    (node, from)
}

fn stage(node: &tensorferry::runtime::InstanceNode, id: &str) {
    tensors::stage_bytes(node, id, "x", 4096, |_| 0);
}

#[test]
fn a_push_the_data_plane_cannot_honour_fails_that_request_and_nothing_else() {
    let (mut tx, mut rx) = UdsChannel::bind(&endpoint("coord")).unwrap().split();
    let (node, at) = registered_instance(&mut tx, &mut rx);
    // A real receiver pool to aim at.
    let receiver = tensorferry_shm::ShmTransport::new(1 << 20, 1, 1 << 20).unwrap();
    let (good, base) = (
        tensorferry_core::transport::Transport::session_id(&receiver).to_owned(),
        receiver.pool_ptr() as u64,
    );
    // Each refusal says what kind of failure it is, then the data plane's
    // own account of it.
    let oob = |addr: u64| {
        format!(
            "write outside registered memory: write of 4096 bytes to {addr:#x} falls outside \
             peer {good}'s pool ({base:#x}, 1048576 bytes)"
        )
    };
    let cases = [
        // Past the end of the receiver's pool.
        (
            "r-oob",
            good.as_str(),
            base + (1 << 20) - 100,
            oob(base + (1 << 20) - 100),
        ),
        // Before its start.
        ("r-low", good.as_str(), base - 4096, oob(base - 4096)),
        // A session whose object does not exist.
        (
            "r-gone",
            "shm:/ferry-no-such-object@1000+1048576",
            0x1000,
            "peer gone: peer session shm:/ferry-no-such-object@1000+1048576: \
             its shared-memory object is gone"
                .to_owned(),
        ),
        // Not a session id at all.
        (
            "r-junk",
            "tcp://10.0.0.1:5000",
            0,
            "unknown peer: session id \"tcp://10.0.0.1:5000\" is not a shared-memory session: \
             no shm: prefix"
                .to_owned(),
        ),
    ];
    for (id, session, addr, error) in cases {
        stage(&node, id);
        let (_, staged) = next(&mut rx);
        assert!(staged.contains("transfer_staged"), "{staged}");
        send(
            &mut tx,
            &at,
            &Msg::Push(Push {
                request_id: id.into(),
                dest_session_id: session.into(),
                dest_addr: addr,
                transfer_size: 4096,
            }),
        );
        let (_, pushed) = next(&mut rx);
        let Ok(Msg::Pushed(p)) = decode(pushed.as_bytes()) else {
            panic!("{pushed}")
        };
        assert_eq!((p.request_id.raw(), p.success), (id, false), "{pushed}");
        let mut text = [0u8; 512];
        let error_text = p
            .error
            .map(|e| e.unescape_into(&mut text).unwrap().to_owned());
        assert_eq!(error_text.as_deref(), Some(error.as_str()), "{pushed}");
    }
    // The instance is unharmed: a good push goes through, the bytes land.
    stage(&node, "r-ok");
    let _ = next(&mut rx);
    send(
        &mut tx,
        &at,
        &Msg::Push(Push {
            request_id: "r-ok".into(),
            dest_session_id: good.as_str().into(),
            dest_addr: base + 8192,
            transfer_size: 4096,
        }),
    );
    let (_, pushed) = next(&mut rx);
    assert!(
        pushed.contains(r#""request_id":"r-ok""#) && !pushed.contains("false"),
        "{pushed}"
    );
    let s = node.stats();
    assert_eq!((s.requests_held, s.live_slots), (0, 0), "{s:?}");
    assert_eq!(s.metrics.write_errors, 4);
}

#[test]
fn garbage_from_a_peer_is_counted_and_dropped() {
    let (mut tx, mut rx) = UdsChannel::bind(&endpoint("coord")).unwrap().split();
    let (node, at) = registered_instance(&mut tx, &mut rx);
    tx.send(&at, &[TRANSFER_MAGIC, b"{not json"]).unwrap();
    tx.send(
        &at,
        &[
            TRANSFER_MAGIC,
            br#"{"msg_type":"transfer_push","dest_addr":-1}"#,
        ],
    )
    .unwrap();
    tx.send(&at, &[b"work-item", b"\x00\x01 opaque"]).unwrap();
    tx.send(
        &at,
        &[
            TRANSFER_MAGIC,
            br#"{"msg_type":"transfer_push","request_id":"nobody"}"#,
        ],
    )
    .unwrap();
    for _ in 0..200 {
        let m = node.stats().metrics;
        if m.bad_frames == 2 && m.non_transfer == 1 && m.ignored == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = node.stats().metrics;
    assert_eq!(
        (m.bad_frames, m.non_transfer, m.ignored),
        (2, 1, 1),
        "{m:?}"
    );
    // Still serving.
    stage(&node, "after");
    let (_, staged) = next(&mut rx);
    assert!(staged.contains(r#""request_id":"after""#), "{staged}");
}

#[test]
fn over_zeromq_bad_frames_are_counted_and_dropped() {
    use tensorferry_zmq::{ZmqChannel, ZmqConfig};

    let ctx = zmq::Context::new();
    let coord = ctx.socket(zmq::PULL).unwrap();
    coord.bind("tcp://127.0.0.1:*").unwrap();
    let coord_ep = coord.get_last_endpoint().unwrap().unwrap();
    let channel = ZmqChannel::bind(&ctx, &["tcp://127.0.0.1:*"], ZmqConfig::default()).unwrap();
    let work = channel.endpoints()[0].clone();
    let node = DataPlane::default()
        .start_instance(
            &InstanceNodeConfig::new("encoder", &coord_ep),
            16 << 20,
            channel,
        )
        .unwrap();
    coord.set_rcvtimeo(5000).unwrap();
    let frames = coord.recv_multipart(0).unwrap();
    let Ok(Msg::Register(r)) = decode(&frames[1]) else {
        panic!("{frames:?}")
    };
    let to = ctx.socket(zmq::PUSH).unwrap();
    to.connect(&work).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = Msg::RegisterAck(RegisterAck {
        session_id: r.session_id,
        role: r.role,
        accepted: true,
        error: None,
    })
    .encode(&mut buf)
    .unwrap();
    to.send_multipart([TRANSFER_MAGIC, &buf[..n]], 0).unwrap();
    node.wait_registered(Duration::from_secs(5)).unwrap();
    // A work item (not a transfer), a transfer without its payload, one
    // larger than the receive buffer, and garbage JSON.
    to.send_multipart([&b"work"[..], b"item"], 0).unwrap();
    to.send(TRANSFER_MAGIC, 0).unwrap();
    to.send_multipart([TRANSFER_MAGIC, &vec![b' '; 2 << 20][..]], 0)
        .unwrap();
    to.send_multipart([TRANSFER_MAGIC, b"{\"msg_type\":"], 0)
        .unwrap();
    for _ in 0..200 {
        let m = node.stats().metrics;
        if m.bad_frames == 3 && m.non_transfer == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = node.stats().metrics;
    assert_eq!((m.bad_frames, m.non_transfer), (3, 1), "{m:?}");
    // The work item reached the application untouched.
    let f = node
        .next_frame(Duration::from_secs(1))
        .expect("the work item");
    assert_eq!((&f.magic[..], &f.payload[..]), (&b"work"[..], &b"item"[..]));
    // Still serving.
    stage(&node, "after");
    let frames = coord.recv_multipart(0).unwrap();
    let text = String::from_utf8_lossy(&frames[1]).into_owned();
    assert!(text.contains(r#""request_id":"after""#), "{text}");
}
