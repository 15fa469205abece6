//! Who an engine's notification inbox hears under CURVE and an
//! allow-list, by TCP and by its Unix name: strangers speaking its stream
//! (tests/common/stranger.rs) without a key, with a key nobody admitted,
//! from outside the allow-list, or under an admitted key claiming another
//! engine's name, are not heard; the admitted key under its own name is,
//! and so is the admitted engine itself.

use std::time::{Duration, Instant};

use tensorferry::engine::{DataPlane, EngineConfig, LocalConfig, TransferEngine};
use tensorferry_zmq::{CurveConfig, CurveKeyPair, Guard};

use super::stranger::{notify_as, notify_locally_as};

fn guarded(key: &CurveKeyPair, peers: &[&CurveKeyPair]) -> TransferEngine {
    let mut options = EngineConfig::default();
    options.guard = Some(Guard {
        allow: vec!["127.0.0.1".parse().unwrap()],
        curve: Some(CurveConfig {
            key: key.clone(),
            peers: peers.iter().map(|p| *p.public()).collect(),
        }),
    });
    TransferEngine::open_with(DataPlane::Local(LocalConfig::default()), options).unwrap()
}

/// What `a` received within a little while.
fn received(a: &TransferEngine, at_least: usize) -> Vec<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && (got.len() < at_least || at_least == 0) {
        got.extend(
            a.notifications()
                .unwrap()
                .into_iter()
                .map(|n| (n.from, n.message)),
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    got
}

#[test]
fn under_curve_the_inbox_hears_admitted_keys_under_their_own_names_only() {
    let [a_key, b_key, other] = [(); 3].map(|()| CurveKeyPair::generate().unwrap());
    let a = guarded(&a_key, &[&b_key]);
    let b = guarded(&b_key, &[&a_key]);
    let (a_sid, b_sid) = (a.session_id(), b.session_id());
    // `<40-character key>@tcp://...`
    let inbox = a_sid.rsplit_once('|').unwrap().1[41..].to_owned();
    let server = *a_key.public();
    let someone_else = b_sid.replace(&b_key.public().to_z85(), &other.public().to_z85());

    for local in [false, true] {
        let speak = |key: Option<&CurveKeyPair>, source: &str, claimed: &str, message: &str| {
            let key = key.map(|k| (k.clone(), server));
            if local {
                notify_locally_as(&inbox, key, claimed, message)
            } else {
                notify_as(&inbox, source, key, claimed, message)
            }
        };
        let forged = a.forged_notifications();
        speak(None, "127.0.0.1", &b_sid, "no key");
        speak(Some(&other), "127.0.0.1", &b_sid, "a key nobody admitted");
        if !local {
            speak(Some(&b_key), "127.0.0.2", &b_sid, "outside the allow-list");
        }
        assert_eq!(
            speak(Some(&b_key), "127.0.0.1", &someone_else, "another's name"),
            20,
            "the admitted key's stream was cut"
        );
        assert!(
            received(&a, 0).is_empty(),
            "a stranger was heard (by Unix socket: {local})"
        );
        assert_eq!(
            a.forged_notifications() - forged,
            20,
            "the forgeries were counted"
        );

        // The admitted key under its own name is heard: the strangers
        // above spoke the stream right, and were refused for who they are.
        assert_eq!(speak(Some(&b_key), "127.0.0.1", &b_sid, "honest"), 20);
        let got = received(&a, 20);
        assert_eq!(got.len(), 20, "by Unix socket: {local}");
        assert!(got.iter().all(|(from, m)| *from == b_sid && m == b"honest"));
    }

    // And the admitted engine itself.
    b.notify(&a_sid, b"from b").unwrap();
    assert_eq!(received(&a, 1), [(b_sid.clone(), b"from b".to_vec())]);
}

/// An allow-list without CURVE: a stranger by TCP from an address off the
/// list is not heard, one on it is; and an engine of this host reaches an
/// inbox bound on another of its addresses by its Unix name although
/// loopback is not on the list (it is held to the list as the inbox's own
/// address, which it could connect from by TCP too).
#[test]
fn an_allow_list_alone_admits_listed_addresses_and_this_hosts_engines() {
    let mut options = EngineConfig::default();
    options.notify_host = Some("127.0.0.2".into());
    options.guard = Some(Guard::allowing(&["127.0.0.2".parse().unwrap()]));
    let a = TransferEngine::open_with(DataPlane::Local(LocalConfig::default()), options).unwrap();
    let a_sid = a.session_id();
    let inbox = a_sid.rsplit_once('|').unwrap().1.to_owned();
    assert!(inbox.starts_with("tcp://127.0.0.2:"), "{inbox}");

    notify_as(&inbox, "127.0.0.3", None, "stranger", "off the list");
    assert!(
        received(&a, 0).is_empty(),
        "an address off the list was heard"
    );
    assert_eq!(
        notify_as(&inbox, "127.0.0.2", None, "listed", "on the list"),
        20
    );
    let got = received(&a, 20);
    assert_eq!(got.len(), 20);
    assert!(got
        .iter()
        .all(|(from, m)| from == "listed" && m == b"on the list"));

    let b = TransferEngine::open(DataPlane::Local(LocalConfig::default())).unwrap();
    b.notify(&a_sid, b"from this host").unwrap();
    assert_eq!(
        received(&a, 1),
        [(b.session_id(), b"from this host".to_vec())]
    );
}

/// Under CURVE a connection that never sends its handshake is closed.
#[test]
fn a_connection_without_its_handshake_is_closed() {
    let [a_key, b_key] = [(); 2].map(|()| CurveKeyPair::generate().unwrap());
    let a = guarded(&a_key, &[&b_key]);
    let inbox = a.session_id().rsplit_once('|').unwrap().1[41..].to_owned();
    let mut idle = std::net::TcpStream::connect(inbox.trim_start_matches("tcp://")).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 1];
    let n = std::io::Read::read(&mut idle, &mut buf);
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "closed only after {:?}",
        started.elapsed()
    );
}
