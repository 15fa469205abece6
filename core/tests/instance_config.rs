//! The instance's configuration: ferry's defaults and the policy for
//! serving under sglang's head, which the runtime and the simulation both
//! take from here.

use std::time::Duration;

use tensorferry_core::handshake::instance::{
    Head, InstanceConfig, InstanceIdentity, Prealloc, SGLANG_HEAD_TIMEOUT,
};

#[test]
fn under_sglang_outlasts_the_heads_one_timeout_and_changes_nothing_else() {
    let base = InstanceConfig {
        prealloc: Prealloc {
            count: 4,
            size: 16 << 20,
        },
        ..InstanceConfig::FERRY
    };
    let t = SGLANG_HEAD_TIMEOUT;
    let sg = base.under_sglang(t);
    assert_eq!(sg.head, Head::Sglang);
    // A staged or reserved slot is kept as long as the head may still use
    // it, plus a tenth and a second for the messages' delay.
    let beyond = Duration::from_secs(600 + 60 + 1);
    assert_eq!(sg.staged_timeout, beyond);
    assert_eq!(sg.reserved_timeout, beyond);
    // An ALLOC without room is held as long as the head waits for it.
    assert_eq!(sg.alloc_hold, t);
    // The rest is the caller's.
    let rest = InstanceConfig {
        head: base.head,
        staged_timeout: base.staged_timeout,
        reserved_timeout: base.reserved_timeout,
        alloc_hold: base.alloc_hold,
        ..sg
    };
    assert_eq!(rest, base);
}

#[test]
fn under_sglang_saturates_instead_of_overflowing() {
    let sg = InstanceConfig::FERRY.under_sglang(Duration::MAX);
    assert_eq!(sg.staged_timeout, Duration::MAX);
    assert_eq!(sg.alloc_hold, Duration::MAX);
}

#[test]
fn ferrys_defaults_serve_ferrys_coordinator() {
    let c = InstanceConfig::default();
    assert_eq!(c, InstanceConfig::FERRY);
    assert_eq!(c.head, Head::Ferry);
    assert_eq!(c.prealloc, Prealloc::NONE);
    // A staged slot outwaits the coordinator's queue and alloc timeouts
    // (30 s and 2 s by default).
    assert!(c.staged_timeout > Duration::from_secs(32));
    assert_eq!(c.pool(1 << 30).min_block, c.min_block);
}

#[test]
fn the_quarantine_is_derived_from_the_data_planes_write_lifetime() {
    let c = InstanceConfig::FERRY;
    // A plane whose writes are made within the call (shared memory): the
    // default stands.
    assert_eq!(c.quarantine_for(Duration::ZERO).quarantine, c.quarantine);
    // verbs' default: a 5 s write timeout and a second to end the queue
    // pair; a push may come a message delay late.
    let verbs = Duration::from_secs(6);
    let q = c.quarantine_for(verbs).quarantine;
    assert_eq!(q, verbs + c.message_delay);
    assert_eq!(c.quarantine_needed(verbs), q);
    // Never shortened, and saturating.
    let long = InstanceConfig {
        quarantine: Duration::from_secs(60),
        ..c
    };
    assert_eq!(
        long.quarantine_for(verbs).quarantine,
        Duration::from_secs(60)
    );
    assert_eq!(c.quarantine_for(Duration::MAX).quarantine, Duration::MAX);
}

/// A denoiser with a 16 MiB pool whose writes may land up to
/// `write_lifetime` after they are posted.
fn denoiser(write_lifetime: Duration) -> InstanceIdentity<'static> {
    InstanceIdentity {
        role: "denoiser",
        session_id: "s",
        work_endpoint: "tcp://den:1",
        coordinator: "tcp://coordinator",
        pool_ptr: 0x1000,
        pool_size: 1 << 24,
        delivery_complete: true,
        write_lifetime,
    }
}

#[test]
fn an_instance_whose_quarantine_a_write_may_outlive_refuses_to_start() {
    use tensorferry_core::handshake::instance::{Instance, InstanceError, InstanceStorage};
    use tensorferry_core::handshake::{Instant, Limits};
    let who = denoiser(Duration::from_secs(6));
    let start = |config: &InstanceConfig| {
        let storage =
            InstanceStorage::owned(&Limits::INSTANCE, &config.pool(who.pool_size), 0).unwrap();
        Instance::new(Instant(0), &who, config, storage).map(|_| ())
    };
    let short = InstanceConfig::FERRY;
    let err = start(&short).unwrap_err();
    assert_eq!(
        err,
        InstanceError::QuarantineTooShort {
            quarantine: Duration::from_secs(1),
            needed: Duration::from_secs(7),
        }
    );
    assert!(err.to_string().contains("next tenant"), "{err}");
    start(&short.quarantine_for(who.write_lifetime)).unwrap();
}

/// Storage is sized by each part's `storage_needed`, not by prose: a
/// slice of another length is refused, and the error names it.
#[test]
fn an_instance_refuses_storage_of_the_wrong_size_naming_the_slice() {
    use tensorferry_core::handshake::instance::{Instance, InstanceError, InstanceStorage};
    use tensorferry_core::handshake::{Instant, Limits, StorageError};
    let who = denoiser(Duration::ZERO);
    let config = InstanceConfig::FERRY;
    let limits = Limits {
        requests: 8,
        tombstones: 16,
        ..Limits::INSTANCE
    };
    let pool = config.pool(who.pool_size);
    let needed = InstanceStorage::storage_needed(&limits, &pool, 0).unwrap();
    assert_eq!(needed.transfers.held, 16);
    assert_eq!(needed.outbox.actions, 8);
    let owned = || InstanceStorage::owned(&limits, &pool, 0).unwrap();
    assert!(Instance::new(Instant(0), &who, &config, owned()).is_ok());
    let refused = |storage| Instance::new(Instant(0), &who, &config, storage).unwrap_err();
    // The slice a storage error names.
    let slice = |err: &InstanceError| match err {
        InstanceError::Storage(e) => Some((e.part, e.field)),
        _ => None,
    };

    let mut held = [None; 15];
    let mut storage = owned();
    storage.transfers.held = (&mut held[..]).into();
    let err = refused(storage);
    assert_eq!(
        err,
        InstanceError::Storage(StorageError {
            part: "transfers",
            field: "held",
            needed: 16,
            given: 15,
        })
    );
    assert!(err.to_string().contains("transfers.held"), "{err}");

    let mut events = [None; 100];
    let mut storage = owned();
    storage.outbox.events = (&mut events[..]).into();
    let err = refused(storage);
    assert_eq!(slice(&err), Some(("outbox", "events")), "{err}");

    let mut free = [0u32; 7];
    let mut storage = owned();
    storage.transfers.live.requests.free = (&mut free[..]).into();
    let err = refused(storage);
    assert_eq!(
        slice(&err),
        Some(("transfers.live.requests", "free")),
        "{err}"
    );

    // What both machines' parts keep alike is named by its path.
    type Set = fn(&mut InstanceStorage<'static>);
    let alike: [(Set, (&str, &str)); 3] = [
        (
            |s| s.transfers.live.nested = vec![0u8; 1].into(),
            ("transfers.live", "nested"),
        ),
        (
            |s| s.transfers.tombstones.index = vec![0u64; 1].into(),
            ("transfers.tombstones", "index"),
        ),
        (
            |s| s.slots.prealloc_timers.places = vec![0u64; 1].into(),
            ("slots.prealloc_timers", "places"),
        ),
    ];
    for (set, named) in alike {
        let mut storage = owned();
        set(&mut storage);
        let err = refused(storage);
        assert_eq!(slice(&err), Some(named), "{err}");
    }
}
