//! Who sent it: the coordinator's peer table.

use crate::harness::{self, blob, incoming};
use crate::paths::{self, *};
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant, PeerId};
use tensorferry_core::json::RawJson;
use tensorferry_core::transport::Incoming;
use tensorferry_core::wire::{decode, Manifest};

fn register_json(role: &str, ep: &str) -> String {
    format!(
        r#"{{"msg_type":"transfer_register","role":"{role}","session_id":"s-{ep}","pool_ptr":4096,"pool_size":65536,"work_endpoint":"{ep}"}}"#
    )
}

/// Every message the coordinator has queued, with the endpoint it goes to.
fn transmitted(c: &mut Coordinator<'static>) -> Vec<(String, String)> {
    let mut buf = vec![0u8; 4096];
    harness::coordinator_outbox(c, &mut buf)
        .into_iter()
        .map(|(to, m)| {
            let to = c.endpoint_of(to).unwrap_or("").to_owned();
            (to, String::from_utf8(m).unwrap())
        })
        .collect()
}

#[test]
fn a_flood_of_strangers_takes_a_bounded_table_and_members_keep_their_places() {
    let mut c = coordinator(8);
    let now = Instant(0);
    let den = c
        .handle_incoming(
            now,
            &incoming(
                "tcp://den:1",
                "",
                register_json("denoiser", "tcp://den:1").as_bytes(),
            ),
        )
        .unwrap();
    assert_eq!(transmitted(&mut c).len(), 1);
    let places = peer_table_len(LIMITS.members);
    for i in 0..10 * places {
        let ep = format!("tcp://forger:{i}");
        let reg = register_json("overlord", &ep);
        let r = c.handle_incoming(now, &incoming(&ep, "", reg.as_bytes()));
        let peer = r.unwrap();
        // Every place the forgers get is a stranger's, within the table.
        assert!(peer.0 as usize <= places, "{peer:?}");
        assert_ne!(peer, den);
        // The refusal goes to the forger that asked, and to no one else.
        let sent = transmitted(&mut c);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, ep);
        assert!(sent[0].1.contains("unknown role"), "{}", sent[0].1);
    }
    assert_eq!(c.members(), 1);
    assert_eq!(c.peer_at("tcp://den:1"), Some(den));
    assert_eq!(c.endpoint_of(den), Some("tcp://den:1"));
    // The member is still answered at its endpoint: a retried
    // registration is handled (answered again), not ignored.
    let again = c.handle_incoming(
        now,
        &incoming(
            "tcp://den:1",
            "",
            register_json("denoiser", "tcp://den:1").as_bytes(),
        ),
    );
    assert_eq!(again, Ok(den));
    assert_eq!(c.stats().ignored, 0, "{:?}", c.stats());
    assert_eq!(transmitted(&mut c)[0].0, "tcp://den:1");
}

#[test]
fn an_answer_queued_for_a_place_that_changed_hands_is_not_sent_to_its_new_holder() {
    let config = paths::COORDINATOR;
    let mut storage = CoordinatorStorage::owned(&LIMITS);
    // Room for the members and one stranger more.
    storage.peers = vec![PeerSlot::EMPTY; LIMITS.members + 1].into();
    let mut c = Coordinator::new(&PIPELINE, config, storage).unwrap();
    let now = Instant(0);
    let mut first = None;
    for i in 0..=LIMITS.members + 1 {
        let ep = format!("tcp://x:{i}");
        let p = c
            .handle_incoming(
                now,
                &incoming(&ep, "", register_json("overlord", &ep).as_bytes()),
            )
            .unwrap();
        first.get_or_insert(p);
    }
    // Every refusal was queued; the places of the first strangers went to
    // the last ones before any was sent. Only the answers whose place is
    // still their addressee's go out, each to its own asker.
    let sent = transmitted(&mut c);
    assert_eq!(sent.len(), LIMITS.members + 1);
    for (to, msg) in &sent {
        assert!(
            msg.contains(&format!(r#""session_id":"s-{to}""#)),
            "{to}: {msg}"
        );
    }
    assert_eq!(c.stats().transmits_dropped, 1);
    assert_eq!(
        c.endpoint_of(first.unwrap()),
        Some(&*format!("tcp://x:{}", LIMITS.members + 1))
    );
    // A table no larger than the member table is refused outright.
    let mut storage = CoordinatorStorage::owned(&LIMITS);
    storage.peers = vec![PeerSlot::EMPTY; LIMITS.members].into();
    assert_eq!(
        Coordinator::new(&PIPELINE, config, storage).err(),
        Some(ConfigError::PeerTableTooSmall)
    );
}

/// Hands every message the coordinator has queued to the instance it is
/// for: `enc` at `tcp://enc:1`, `den` otherwise.
fn to_insts(
    coord: &mut Coordinator<'static>,
    enc: &mut Instance<'static>,
    den: &mut Instance<'static>,
    now: Instant,
) {
    for (to, msg) in transmitted(coord) {
        let msg = decode(msg.as_bytes()).unwrap();
        let inst = if to == "tcp://enc:1" {
            &mut *enc
        } else {
            &mut *den
        };
        let _ = inst.handle(now, &msg);
    }
}

/// The coordinator's endpoint for encoders, in [`role_endpoints`].
const ENC_VIA: &str = "tcp://coord:enc";
/// The coordinator's endpoint for denoisers, in [`role_endpoints`].
const DEN_VIA: &str = "tcp://coord:den";

/// A coordinator whose encoders and denoisers report to endpoints of their
/// own ([`ENC_VIA`], [`DEN_VIA`]), as under sglang's head, and
/// an encoder and a denoiser, not yet registered.
fn role_endpoints() -> (Coordinator<'static>, Instance<'static>, Instance<'static>) {
    let mut coord = coordinator(8);
    coord.set_role_endpoint("encoder", ENC_VIA).unwrap();
    coord.set_role_endpoint("denoiser", DEN_VIA).unwrap();
    let enc = instance("encoder", "enc-0", "tcp://enc:1");
    let den = instance("denoiser", "den-0", "tcp://den:1");
    (coord, enc, den)
}

/// Every message `inst` has to send, delivered as a channel that names no
/// sender delivers it, at `via`, from a connection authenticated as `user`
/// (`""`: none): what the coordinator made of each.
fn deliver(
    coord: &mut Coordinator<'static>,
    inst: &mut Instance<'static>,
    user: &str,
    via: &str,
    now: Instant,
) -> Vec<Result<PeerId, Unhandled>> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut results = Vec::new();
    while let Some(n) = inst.poll_transmit(&mut buf) {
        let n = n.unwrap();
        results.push(coord.handle_incoming(now, &as_user(user, via, &buf[..n])));
    }
    results
}

/// The encoder stages and commits request `r-1`: one 4 KiB tensor, no
/// scalar fields.
fn send_r1(enc: &mut Instance<'static>, now: Instant) {
    let (token, _) = enc.stage("r-1", 4 * KIB).unwrap();
    let dims = [4 * KIB];
    let entries = [blob(&dims)];
    let scalars = RawJson::parse_object("{}").unwrap();
    enc.commit(now, token, 4 * KIB, &Manifest::Entries(&entries), scalars)
        .unwrap();
}

/// Asserts the coordinator took every message [`deliver`] delivered.
#[track_caller]
fn all_taken(results: Vec<Result<PeerId, Unhandled>>) {
    for r in results {
        r.unwrap();
    }
}

#[test]
fn without_sender_names_a_registration_names_its_endpoint_and_a_result_counts_as_done() {
    // A channel that cannot name senders (ZeroMQ's PULL): each role
    // reports to an endpoint of its own, as under sglang's head.
    let (mut coord, mut enc, mut den) = role_endpoints();
    assert_eq!(
        coord.set_role_endpoint("painter", "tcp://coord:p"),
        Err(ConfigError::UnknownRole)
    );
    let mut now = Instant(0);
    for r in deliver(&mut coord, &mut enc, "", ENC_VIA, now) {
        assert_eq!(coord.endpoint_of(r.unwrap()), Some("tcp://enc:1"));
    }
    for r in deliver(&mut coord, &mut den, "", DEN_VIA, now) {
        assert_eq!(coord.endpoint_of(r.unwrap()), Some("tcp://den:1"));
    }
    to_insts(&mut coord, &mut enc, &mut den, now);
    assert!(enc.is_registered() && den.is_registered());
    // encoder → denoiser, every message judged by content and endpoint.
    send_r1(&mut enc, now);
    for _ in 0..4 {
        now = Instant(now.0 + MS);
        deliver(&mut coord, &mut enc, "", ENC_VIA, now);
        deliver(&mut coord, &mut den, "", DEN_VIA, now);
        while let Some(w) = enc.poll_action() {
            enc.handle_completion(now, w.token, Ok(())).unwrap();
        }
        to_insts(&mut coord, &mut enc, &mut den, now);
    }
    assert!(
        std::iter::from_fn(|| den.poll_event()).any(|e| matches!(e, InstanceEvent::Received(_)))
    );
    assert_eq!(coord.in_flight(), 1);
    // The denoiser's result (a tensor multipart whose first frame is its
    // descriptor), not a `transfer_done`, ends the leg.
    let result = br#"{"tensor_descriptors":[],"scalar_fields":{"request_id":"r-1"}}"#;
    let done = Incoming {
        from: "",
        user: "",
        via: DEN_VIA,
        magic: result,
        payload: b"",
    };
    coord.handle_incoming(now, &done).unwrap();
    assert_eq!(coord.in_flight(), 0);
    assert!(std::iter::from_fn(|| coord.poll_event())
        .any(|e| matches!(e, CoordinatorEvent::Delivered { leg: 0, .. })));
    // Arriving at no role's endpoint, a message no content names is
    // nobody's.
    let pushed = br#"{"msg_type":"transfer_pushed","request_id":"r-9","success":true}"#;
    assert_eq!(
        coord.handle_incoming(now, &incoming("", "tcp://coord:other", pushed)),
        Err(Unhandled::UnknownSender)
    );
}

/// `payload` as a channel that names no sender but authenticated its
/// connection as `user` delivers it (ZeroMQ's PULL under CURVE: the
/// `User-Id` is the sender's key).
fn as_user<'a>(user: &'a str, via: &'a str, payload: &'a [u8]) -> Incoming<'a> {
    Incoming {
        user,
        ..incoming("", via, payload)
    }
}

#[test]
fn with_keys_an_instance_is_spoken_for_only_by_the_key_it_registered_with() {
    let (mut coord, mut enc, mut den) = role_endpoints();
    let (enc_key, den_key) = ("key-of-the-encoder", "key-of-the-denoiser");
    let mut now = Instant(0);
    all_taken(deliver(&mut coord, &mut enc, enc_key, ENC_VIA, now));
    all_taken(deliver(&mut coord, &mut den, den_key, DEN_VIA, now));
    to_insts(&mut coord, &mut enc, &mut den, now);
    assert!(enc.is_registered() && den.is_registered());
    let wrong_key = |r: Result<PeerId, Unhandled>| {
        matches!(
            r,
            Err(Unhandled::Ignored {
                why: Ignored::WrongKey,
                ..
            })
        )
    };

    // Another key cannot take the denoiser's endpoint over, and nothing is
    // answered (the answer would go to the denoiser).
    let takeover = register_json("denoiser", "tcp://den:1");
    let r = coord.handle_incoming(now, &as_user(enc_key, DEN_VIA, takeover.as_bytes()));
    assert!(wrong_key(r), "{r:?}");
    assert!(transmitted(&mut coord).is_empty());
    assert_eq!(coord.members(), 2);
    assert!(std::iter::from_fn(|| coord.poll_event())
        .any(|e| matches!(e, CoordinatorEvent::Refused { acked: false, .. })));

    // encoder → denoiser, each side speaking with its own key.
    send_r1(&mut enc, now);
    let mut delivered = false;
    for _ in 0..4 {
        now = Instant(now.0 + MS);
        all_taken(deliver(&mut coord, &mut enc, enc_key, ENC_VIA, now));
        // The denoiser's release waits: the forgeries come first.
        if !delivered {
            delivered = std::iter::from_fn(|| den.poll_event())
                .any(|e| matches!(e, InstanceEvent::Received(_)));
            if !delivered {
                all_taken(deliver(&mut coord, &mut den, den_key, DEN_VIA, now));
            }
        }
        while let Some(w) = enc.poll_action() {
            enc.handle_completion(now, w.token, Ok(())).unwrap();
        }
        to_insts(&mut coord, &mut enc, &mut den, now);
    }
    assert!(delivered);
    assert_eq!(coord.in_flight(), 1);
    // The encoder's key speaking for the denoiser, by content: its
    // `transfer_done` for the leg the denoiser holds, its deregistration
    // by the denoiser's session, and a staging under the denoiser's
    // session; none is taken as the denoiser's.
    let forged = [
        r#"{"msg_type":"transfer_done","request_id":"r-1","error":null}"#.to_owned(),
        r#"{"msg_type":"transfer_deregister","session_id":"den-0","draining":false,"reason":"forged"}"#.to_owned(),
        r#"{"msg_type":"transfer_staged","request_id":"r-2","data_size":4096,"manifest":{},"session_id":"den-0","pool_ptr":0,"slot_offset":0}"#.to_owned(),
    ];
    for f in &forged {
        for via in [DEN_VIA, ENC_VIA] {
            let r = coord.handle_incoming(now, &as_user(enc_key, via, f.as_bytes()));
            assert!(r.is_err(), "{f} via {via}: {r:?}");
        }
    }
    assert_eq!(coord.in_flight(), 1);
    assert_eq!(coord.members(), 2);
    assert!(transmitted(&mut coord).is_empty());
    // The denoiser's own done, on its own key, ends the leg.
    let done = r#"{"msg_type":"transfer_done","request_id":"r-1","error":null}"#;
    coord
        .handle_incoming(now, &as_user(den_key, DEN_VIA, done.as_bytes()))
        .unwrap();
    assert_eq!(coord.in_flight(), 0);
    assert!(std::iter::from_fn(|| coord.poll_event())
        .any(|e| matches!(e, CoordinatorEvent::Delivered { leg: 0, .. })));
    // Once the denoiser's connection is gone, its endpoint is free for a
    // new key (an instance restarted with another certificate).
    assert!(coord.handle_gone(now, "tcp://den:1"));
    let back = register_json("denoiser", "tcp://den:1");
    coord
        .handle_incoming(now, &as_user(enc_key, DEN_VIA, back.as_bytes()))
        .unwrap();
    assert_eq!(coord.members(), 2);
}

#[test]
fn garbage_and_foreign_messages_are_told_apart_and_change_nothing() {
    let mut c = coordinator(8);
    let bad = c.handle_incoming(Instant(0), &incoming("tcp://x:1", "", b"{not json"));
    assert!(matches!(bad, Err(Unhandled::Malformed(_))), "{bad:?}");
    let foreign = Incoming {
        from: "tcp://x:1",
        user: "",
        via: "",
        magic: b"req-1",
        payload: b"\x80\x04pickled",
    };
    assert_eq!(
        c.handle_incoming(Instant(0), &foreign),
        Err(Unhandled::Foreign)
    );
    assert_eq!(c.members(), 0);
    assert!(transmitted(&mut c).is_empty());
    // An endpoint longer than the coordinator keeps is no one's.
    let long = format!("tcp://{}:1", "h".repeat(200));
    let reg = register_json("denoiser", "tcp://d:1");
    assert!(matches!(
        c.handle_incoming(Instant(0), &incoming(&long, "", reg.as_bytes())),
        Err(Unhandled::Ignored {
            why: Ignored::TooLong(_),
            ..
        })
    ));
}

#[test]
fn a_members_connection_closing_fails_its_transfers_at_once() {
    world!(w, 4);
    w.stage_held(0, "r-1", 4 * KIB);
    assert_eq!(w.coord.in_flight(), 1);
    assert!(!w.coord.handle_gone(w.now, "tcp://nobody:1"));
    assert!(w.coord.handle_gone(w.now, "tcp://den:1"));
    assert_eq!(w.coord.in_flight(), 0);
    assert_eq!(w.coord.members(), 1);
    w.pump();
    assert_eq!(w.failed(), [FailReason::PeerGone]);
}

/// Over a channel that names its senders and authenticates them too, a
/// message from a member's endpoint under another key is not the
/// member's: the check by key stands on its own, not only through the
/// lookup by content that channels naming no sender go through.
#[test]
fn a_named_sender_speaking_under_another_key_is_not_the_member() {
    let mut coord = coordinator(8);
    let reg = register_json("denoiser", "tcp://den:1");
    let from_den = |user| Incoming {
        user,
        ..incoming("tcp://den:1", "", reg.as_bytes())
    };
    coord
        .handle_incoming(Instant(0), &from_den("key-of-the-denoiser"))
        .unwrap();
    assert_eq!(coord.members(), 1);
    let leave = r#"{"msg_type":"transfer_deregister","session_id":"s-tcp://den:1","draining":false,"reason":"forged"}"#;
    let forged = Incoming {
        user: "key-of-another",
        ..incoming("tcp://den:1", "", leave.as_bytes())
    };
    let r = coord.handle_incoming(Instant(0), &forged);
    assert!(
        matches!(
            r,
            Err(Unhandled::Ignored {
                why: Ignored::WrongKey,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(coord.members(), 1, "the member stays");
    // Its own key is heard.
    let own = Incoming {
        user: "key-of-the-denoiser",
        ..forged
    };
    coord.handle_incoming(Instant(0), &own).unwrap();
    assert_eq!(coord.members(), 0);
}
