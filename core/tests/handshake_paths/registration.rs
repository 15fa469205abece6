//! Registrations: what is refused and how it is said (unknown roles, bad
//! slots, overflowing pools, write lifetimes past the limit, too many
//! preallocated slots, endpoints not admitted), a sender's write lifetime
//! at work, and pipelines the coordinator refuses.

use std::time::Duration;

use crate::paths::{self, *};
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{HeapStorage, Ignored, Instant, PeerId, StorageError};
use tensorferry_core::wire::{decode, Msg};

/// The ack the coordinator sends to a registration, if any.
fn answer_to(
    c: &mut Coordinator<'static>,
    peer: u32,
    reg: &[u8],
) -> (Result<(), Ignored>, Option<String>) {
    let r = c.handle(Instant(0), PeerId(peer), &decode(reg).unwrap());
    let mut buf = vec![0u8; 1024];
    let ack = c
        .poll_transmit(&mut buf)
        .map(|t| String::from_utf8(buf[..t.unwrap().len].to_vec()).unwrap());
    (r, ack)
}

fn refusals(c: &mut Coordinator<'static>) -> Vec<(&'static str, bool)> {
    std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            CoordinatorEvent::Refused { reason, acked, .. } => Some((reason, acked)),
            _ => None,
        })
        .collect()
}

#[test]
fn unknown_roles_and_bad_slots_are_refused_at_registration() {
    let mut w = World::new(
        coordinator(8),
        vec![instance("painter", "p-0", "tcp://p:1")],
    );
    assert!(!w.insts[0].is_registered());
    assert!(w.inst_events.contains(&(0, InstanceEvent::Refused)));
    let reg = br#"{"msg_type":"transfer_register","role":"denoiser","session_id":"d","pool_ptr":4096,"pool_size":8192,"work_endpoint":"tcp://d:1","preallocated_slots":[{"offset":4096,"size":8192,"slot_id":0,"addr":8192}]}"#;
    assert_eq!(
        w.coord.handle(w.now, PeerId(5), &decode(reg).unwrap()),
        Ok(())
    );
    let mut buf = vec![0u8; 1024];
    let t = w.coord.poll_transmit(&mut buf).unwrap().unwrap();
    let Msg::RegisterAck(ack) = decode(&buf[..t.len]).unwrap() else {
        panic!()
    };
    assert!(!ack.accepted);
    assert_eq!(ack.error.unwrap(), "bad preallocated_slots");
    assert_eq!(w.coord.members(), 0);
}

#[test]
fn a_pool_whose_end_overflows_is_refused_with_the_reason() {
    let mut c = coordinator(8);
    let reg = br#"{"msg_type":"transfer_register","role":"denoiser","session_id":"d","pool_ptr":18446744073709547520,"pool_size":16777216,"work_endpoint":"tcp://d:1"}"#;
    let (r, ack) = answer_to(&mut c, 1, reg);
    assert_eq!(r, Ok(()));
    let ack = ack.expect("an answer");
    assert!(ack.contains(r#""accepted":false"#), "{ack}");
    assert!(ack.contains("overflows"), "{ack}");
    assert_eq!(c.members(), 0);
    assert_eq!(
        refusals(&mut c),
        [("pool_ptr + pool_size overflows 64 bits", true)]
    );
    // An unknown role is refused the same way, and said.
    let reg = br#"{"msg_type":"transfer_register","role":"overlord","session_id":"o","pool_ptr":4096,"pool_size":4096,"work_endpoint":"tcp://o:1"}"#;
    let (_, ack) = answer_to(&mut c, 2, reg);
    assert!(ack.unwrap().contains("unknown role"));
    assert_eq!(refusals(&mut c), [("unknown role", true)]);
    assert_eq!(c.stats().refused, 2);
}

/// No registration parks the receivers' slots for longer than the
/// operator allows: a write lifetime past `max_write_lifetime` is refused,
/// said; one at it is taken.
#[test]
fn a_registration_stating_a_write_lifetime_past_the_limit_is_refused() {
    let mut c = coordinator(8);
    let max = paths::COORDINATOR.max_write_lifetime.as_millis();
    let reg = |ms: u128, ep: &str| {
        format!(
            r#"{{"msg_type":"transfer_register","role":"denoiser","session_id":"s-{ep}","pool_ptr":4096,"pool_size":65536,"work_endpoint":"{ep}","write_lifetime_ms":{ms}}}"#
        )
    };
    let (r, ack) = answer_to(&mut c, 1, reg(max + 1, "tcp://d:1").as_bytes());
    assert_eq!(r, Ok(()));
    let ack = ack.expect("an answer");
    assert!(ack.contains(r#""accepted":false"#), "{ack}");
    assert!(ack.contains("max_write_lifetime"), "{ack}");
    assert_eq!(c.members(), 0);
    let (r, ack) = answer_to(&mut c, 2, reg(max, "tcp://d:2").as_bytes());
    assert_eq!(r, Ok(()));
    assert!(ack.unwrap().contains(r#""accepted":true"#));
    assert_eq!(c.members(), 1);
}

/// A failed write's slot is parked for its own sender's write lifetime:
/// one sender whose writes may land late does not hold the slots of
/// another's failures out of use.
#[test]
fn a_failed_writes_slot_is_parked_for_its_senders_write_lifetime() {
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        instance("denoiser", "den-0", "tcp://den:1"),
        paths::instance_serving(
            "encoder",
            "enc-slow",
            "tcp://enc:2",
            Serving {
                write_lifetime: Duration::from_millis(40),
                ..Serving::FERRY
            },
        ),
    ];
    let mut w = World::new(coordinator(8), insts);
    assert!(w.insts.iter().all(Instance::is_registered));
    w.wire.writes = None;
    // The prompt sender's failure: its slot back after the 5 ms quarantine.
    w.stage(0, "quick", 6 * KIB);
    w.advance(11);
    assert_eq!(w.failed(), vec![FailReason::PushTimeout]);
    assert_eq!(w.coord.prealloc_taken(), 1);
    w.advance(6);
    assert_eq!(
        w.coord.prealloc_taken(),
        0,
        "parked past its sender's lifetime"
    );
    // The slow sender's: parked for its 40 ms.
    w.stage(2, "slow", 6 * KIB);
    w.advance(11);
    assert_eq!(w.failed().len(), 2);
    w.advance(30);
    assert_eq!(
        w.coord.prealloc_taken(),
        1,
        "reused within its sender's lifetime"
    );
    w.advance(11);
    assert_eq!(w.coord.prealloc_taken(), 0);
}

#[test]
fn with_an_admission_list_only_its_endpoints_register_as_their_roles() {
    let mut c = coordinator(8);
    c.admit("denoiser", "tcp://d:1").unwrap();
    assert_eq!(
        c.admit("painter", "tcp://p:1"),
        Err(ConfigError::UnknownRole)
    );
    let reg = |role: &str, ep: &str| {
        format!(
            r#"{{"msg_type":"transfer_register","role":"{role}","session_id":"s-{ep}","pool_ptr":4096,"pool_size":65536,"work_endpoint":"{ep}"}}"#
        )
    };
    // A stranger: dropped unanswered, and said.
    let (r, ack) = answer_to(&mut c, 1, reg("denoiser", "tcp://ghost:1").as_bytes());
    assert_eq!((r, ack), (Err(Ignored::NotAdmitted), None));
    // An admitted endpoint under another role: the same.
    let (r, ack) = answer_to(&mut c, 2, reg("encoder", "tcp://d:1").as_bytes());
    assert_eq!((r, ack), (Err(Ignored::NotAdmitted), None));
    assert_eq!(
        refusals(&mut c),
        [
            ("the endpoint is not admitted for this role", false),
            ("the endpoint is not admitted for this role", false)
        ]
    );
    assert_eq!(c.members(), 0);
    // The admitted endpoint as its role.
    let (r, ack) = answer_to(&mut c, 3, reg("denoiser", "tcp://d:1").as_bytes());
    assert_eq!(r, Ok(()));
    assert!(ack.unwrap().contains(r#""accepted":true"#));
    assert_eq!(c.members(), 1);
}

#[test]
fn a_registration_with_more_preallocated_slots_than_the_limit_is_refused() {
    let mut c = coordinator(8);
    let slots = |n: u64| {
        (0..n)
            .map(|i| {
                let off = i * 8192;
                format!(
                    r#"{{"offset":{off},"size":8192,"slot_id":{i},"addr":{}}}"#,
                    4096 + off
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let reg = |ep: &str, n: u64| {
        format!(
            r#"{{"msg_type":"transfer_register","role":"denoiser","session_id":"s-{ep}","pool_ptr":4096,"pool_size":1048576,"work_endpoint":"{ep}","preallocated_slots":[{}]}}"#,
            slots(n)
        )
    };
    // As many as the limit: taken.
    let n = LIMITS.prealloc_per_member as u64;
    let (r, ack) = answer_to(&mut c, 1, reg("tcp://d:1", n).as_bytes());
    assert_eq!(r, Ok(()));
    assert!(ack.unwrap().contains(r#""accepted":true"#));
    // One more: refused, and said why.
    let (_, ack) = answer_to(&mut c, 2, reg("tcp://d:2", n + 1).as_bytes());
    let ack = ack.unwrap();
    assert!(ack.contains(r#""accepted":false"#), "{ack}");
    assert!(
        ack.contains("more preallocated_slots than the coordinator takes"),
        "{ack}"
    );
    assert_eq!(c.members(), 1);
}

#[test]
fn a_pipeline_that_names_a_role_twice_is_refused() {
    let storage = CoordinatorStorage::owned(&LIMITS);
    let r = Coordinator::new(
        &["encoder", "denoiser", "encoder"],
        CoordinatorConfig::FERRY,
        storage,
    );
    assert_eq!(r.err(), Some(ConfigError::Pipeline));
}

/// The limits the storage-size tests lay a coordinator's storage out for.
const SIZED: tensorferry_core::handshake::Limits = tensorferry_core::handshake::Limits {
    requests: 8,
    nested_per_request: 256,
    tombstones: 8,
    members: 4,
    prealloc_per_member: 2,
};

/// A coordinator's storage laid out for [`SIZED`].
fn fresh() -> CoordinatorStorage<'static> {
    CoordinatorStorage::owned(&SIZED)
}

/// Why a coordinator of `pipeline` refuses `storage`, if it does.
fn refused_by(pipeline: &[&str], storage: CoordinatorStorage<'static>) -> Option<ConfigError> {
    Coordinator::new(pipeline, CoordinatorConfig::FERRY, storage).err()
}

/// Asserts that `err` is the refusal of the slice `part.field`, `given`
/// long where `needed` are needed, and that its message names the slice.
#[track_caller]
fn assert_wrong_size(
    err: Option<ConfigError>,
    part: &'static str,
    field: &'static str,
    needed: usize,
    given: usize,
) {
    let wrong = StorageError {
        part,
        field,
        needed,
        given,
    };
    assert_eq!(err, Some(ConfigError::Storage(wrong)));
    let shown = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(shown.contains(&format!("{part}.{field}")), "{shown}");
}

/// The coordinator's queues are sized by their `storage_needed`, not by
/// prose: a queue of another length is refused, and the error names it.
#[test]
fn a_coordinator_refuses_queues_of_the_wrong_size_naming_them() {
    let needed = CoordinatorStorage::storage_needed(&SIZED).outbox;
    assert_eq!(needed.transmits, 2 * 8 + 4 + 8);
    let pipeline = ["encoder", "denoiser"];
    assert!(Coordinator::new(&pipeline, CoordinatorConfig::FERRY, fresh()).is_ok());
    let mut storage = fresh();
    storage.outbox.events = vec![None; needed.events + 1].into();
    assert_wrong_size(
        refused_by(&pipeline, storage),
        "outbox",
        "events",
        needed.events,
        needed.events + 1,
    );
}

/// The transfers' storage is sized by their own `storage_needed`: a
/// table or nested-JSON slice of another length is refused, naming the
/// part and the slice; an empty transfer table is still refused as such.
#[test]
fn a_coordinator_refuses_transfer_storage_of_the_wrong_size_naming_it() {
    use tensorferry_core::handshake::{coordinator, Limits, TableStorage};
    let needed = CoordinatorStorage::storage_needed(&SIZED).transfers;
    assert_eq!(
        needed,
        coordinator::TransfersStorage::storage_needed(&SIZED)
    );
    assert_eq!(needed.requests.records, 8);
    assert_eq!(needed.nested, 8 * 256);
    let pipeline = ["encoder", "denoiser"];
    assert!(Coordinator::new(&pipeline, CoordinatorConfig::FERRY, fresh()).is_ok());

    let mut storage = fresh();
    storage.transfers.nested = vec![0u8; needed.nested + 1].into();
    assert_wrong_size(
        refused_by(&pipeline, storage),
        "transfers",
        "nested",
        needed.nested,
        needed.nested + 1,
    );

    let mut storage = fresh();
    storage.transfers.requests.index = vec![0u64; needed.requests.index - 1].into();
    assert_wrong_size(
        refused_by(&pipeline, storage),
        "transfers.requests",
        "index",
        needed.requests.index,
        needed.requests.index - 1,
    );

    let mut storage = fresh();
    storage.transfers.requests = TableStorage::owned(0, true);
    // The queues are sized by the transfers given.
    let none = Limits {
        requests: 0,
        ..SIZED
    };
    let queues = coordinator::OutboxStorage::storage_needed(&none);
    storage.outbox = coordinator::OutboxStorage::owned(&queues);
    assert_eq!(
        Coordinator::new(&pipeline, CoordinatorConfig::FERRY, storage).err(),
        Some(ConfigError::NoTransfers)
    );
}

/// The registry's storage is sized by its own `storage_needed`: an index,
/// a ranking or the member table of another length is refused, naming the
/// part and the slice; a ranking too small for the members is still
/// refused as such, before any other length.
#[test]
fn a_coordinator_refuses_registry_storage_of_the_wrong_size_naming_it() {
    use tensorferry_core::handshake::coordinator;
    let needed = CoordinatorStorage::storage_needed(&SIZED).registry;
    assert_eq!(needed, coordinator::RegistryStorage::storage_needed(&SIZED));
    assert_eq!(needed.members.records, 4);
    assert_eq!(needed.ranking.entries, coordinator::MAX_ROLES * 4);
    assert_eq!(needed.ranking.places, 4);
    let pipeline = ["encoder", "denoiser"];
    assert!(Coordinator::new(&pipeline, CoordinatorConfig::FERRY, fresh()).is_ok());
    let refused = |storage| refused_by(&pipeline, storage);
    let (index, lanes, places) = (
        needed.member_index,
        needed.ranking.entries,
        needed.ranking.places,
    );
    let table_index = needed.members.index;

    let mut storage = fresh();
    storage.registry.sessions = vec![0u64; index + 1].into();
    assert_wrong_size(refused(storage), "registry", "sessions", index, index + 1);

    let mut storage = fresh();
    storage.registry.endpoints = vec![0u64; index - 1].into();
    assert_wrong_size(refused(storage), "registry", "endpoints", index, index - 1);

    // Either ranking's entries or places of another length: refused,
    // naming the ranking and the slice.
    type Pick = for<'a> fn(&'a mut CoordinatorStorage<'static>) -> &'a mut HeapStorage<'static>;
    let rankings: [(&str, Pick); 2] = [
        ("registry.ranking", |s| &mut s.registry.ranking),
        ("registry.room_ranking", |s| &mut s.registry.room_ranking),
    ];
    for (name, pick) in rankings {
        let mut storage = fresh();
        pick(&mut storage).entries = vec![(0u64, 0u32); lanes + 1].into();
        assert_wrong_size(refused(storage), name, "entries", lanes, lanes + 1);
        let mut storage = fresh();
        pick(&mut storage).places = vec![0u64; places + 1].into();
        assert_wrong_size(refused(storage), name, "places", places, places + 1);
    }

    let mut storage = fresh();
    storage.registry.members.index = vec![0u64; table_index + 1].into();
    assert_wrong_size(
        refused(storage),
        "registry.members",
        "index",
        table_index,
        table_index + 1,
    );

    // Too few places or lanes for the members: the ranking is too small,
    // whatever else is off.
    let mut storage = fresh();
    storage.registry.room_ranking.places = vec![0u64; places - 1].into();
    storage.registry.sessions = vec![0u64; 1].into();
    assert_eq!(refused(storage), Some(ConfigError::RankingTooSmall));
    let mut storage = fresh();
    storage.registry.ranking.entries = vec![(0u64, 0u32); 4 * pipeline.len() - 1].into();
    assert_eq!(refused(storage), Some(ConfigError::RankingTooSmall));
}

/// What is left of ended requests (parked slots, tombstones) is sized by
/// its own `storage_needed`, the parked slots by the coordinator's
/// requests, members and slots per member: another length is refused,
/// naming the part and the slice.
#[test]
fn a_coordinator_refuses_remains_storage_of_the_wrong_size_naming_it() {
    use tensorferry_core::handshake::coordinator;
    let needed = CoordinatorStorage::storage_needed(&SIZED).remains;
    assert_eq!(needed, coordinator::RemainsStorage::storage_needed(&SIZED));
    assert_eq!(
        (needed.parked.records, needed.finished.stones),
        (8 + 4 * 2, 8)
    );
    let refused = |storage| refused_by(&["a", "b"], storage);
    assert_eq!(refused(fresh()), None);

    let mut storage = fresh();
    storage.remains.finished.index = vec![0u64; needed.finished.index + 1].into();
    let (index, more) = (needed.finished.index, needed.finished.index + 1);
    assert_wrong_size(refused(storage), "remains.finished", "index", index, more);

    let mut storage = fresh();
    storage.remains.parked.timer_places = vec![0u64; needed.parked.timers - 1].into();
    let (timers, fewer) = (needed.parked.timers, needed.parked.timers - 1);
    assert_wrong_size(
        refused(storage),
        "remains.parked",
        "timer_places",
        timers,
        fewer,
    );

    // Fewer slots per member than the parked table was sized for.
    let mut storage = fresh();
    storage.prealloc_per_member = 1;
    let records = needed.parked.records;
    assert_wrong_size(
        refused(storage),
        "remains.parked",
        "records",
        8 + 4,
        records,
    );
}

/// An instance takes messages as its channel delivers them, as the
/// coordinator does: a frame that is not a transfer message is the
/// application's, one that does not decode is malformed, and a register
/// ack registers it; a peer gone under the coordinator's endpoint is the
/// coordinator lost (it registers anew), any other peer's is no concern.
#[test]
fn an_instance_handles_what_its_channel_delivers_and_knows_its_coordinator_gone() {
    use tensorferry_core::transport::Incoming;
    use tensorferry_core::wire::TRANSFER_MAGIC;
    let mut w = World::new(
        coordinator(8),
        vec![instance("denoiser", "d-0", "tcp://d:1")],
    );
    assert!(w.insts[0].is_registered());
    let inst = &mut w.insts[0];
    assert_eq!(inst.coordinator(), "tcp://coordinator");
    let at = |magic, payload| Incoming {
        from: "tcp://coordinator",
        via: "tcp://d:1",
        user: "",
        magic,
        payload,
    };
    let item: &[u8] = br#"{"request_id":"r"}"#;
    assert_eq!(
        inst.handle_incoming(Instant(1), &at(b"work", item)),
        Err(InstanceUnhandled::Foreign)
    );
    assert!(matches!(
        inst.handle_incoming(Instant(1), &at(TRANSFER_MAGIC, b"{not json")),
        Err(InstanceUnhandled::Malformed(_))
    ));
    let ack = br#"{"msg_type":"transfer_register_ack","session_id":"d-0","accepted":true}"#;
    assert_eq!(
        inst.handle_incoming(Instant(1), &at(TRANSFER_MAGIC, ack)),
        Err(InstanceUnhandled::Ignored(Ignored::Duplicate)),
        "registered already: the second ack is a duplicate"
    );
    let conversation = inst.conversation();
    assert!(!inst.handle_gone(Instant(2), "tcp://e:1"));
    assert!(
        inst.is_registered(),
        "another peer's departure changes nothing"
    );
    assert_eq!(inst.conversation(), conversation);
    assert!(inst.handle_gone(Instant(2), "tcp://coordinator"));
    assert_eq!(inst.registration(), Registration::Pending);
    assert_ne!(
        inst.conversation(),
        conversation,
        "what was polled for the lost coordinator is not to be sent"
    );
    assert!(inst.handle_gone(Instant(3), "tcp://coordinator"));
    assert_eq!(
        inst.conversation(),
        conversation.wrapping_add(1),
        "it was still registering: the same conversation goes on"
    );
}

/// A registration resent while the first one's answer was on its way is
/// answered twice: the second answer is expected (nothing ignored), and an
/// answer beyond those owed is a duplicate.
#[test]
fn the_answer_to_a_resent_registration_is_expected_not_ignored() {
    use tensorferry_core::transport::Incoming;
    use tensorferry_core::wire::TRANSFER_MAGIC;
    let mut inst = instance("denoiser", "d-0", "tcp://d:1");
    let mut buf = vec![0u8; 4096];
    let mut registrations = 0;
    for t in [0, 10] {
        inst.handle_timeout(Instant(t * paths::MS));
        while let Some(n) = inst.poll_transmit(&mut buf) {
            n.unwrap();
            registrations += 1;
        }
    }
    assert_eq!(registrations, 2, "resent after register_retry");
    let ack = br#"{"msg_type":"transfer_register_ack","session_id":"d-0","accepted":true}"#;
    let at = Incoming {
        from: "tcp://coordinator",
        via: "tcp://d:1",
        user: "",
        magic: TRANSFER_MAGIC,
        payload: ack,
    };
    assert_eq!(inst.handle_incoming(Instant(11 * paths::MS), &at), Ok(()));
    assert!(inst.is_registered());
    assert_eq!(inst.handle_incoming(Instant(11 * paths::MS), &at), Ok(()));
    assert_eq!(inst.stats().ignored, 0);
    assert_eq!(
        inst.handle_incoming(Instant(11 * paths::MS), &at),
        Err(InstanceUnhandled::Ignored(Ignored::Duplicate))
    );
}
