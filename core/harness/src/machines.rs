//! The machines and their seams, as every driver of the [`World`] uses
//! them: coordinators and instances built from their configurations over
//! owned tables; a message carried as a channel that names senders carries
//! it, or handed to an instance as its channel delivers it; encoding;
//! draining a machine's output and events; staging a blob; and the checks
//! that a drained machine holds nothing.
//!
//! [`World`]: crate::World

use tensorferry_core::handshake::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorEvent, CoordinatorStorage, Unhandled,
};
use tensorferry_core::handshake::instance::{
    Instance, InstanceConfig, InstanceError, InstanceEvent, InstanceIdentity, InstanceStorage,
    InstanceUnhandled, Token, Write,
};
use tensorferry_core::handshake::{Instant, Limits, PeerId};
use tensorferry_core::json::RawJson;
use tensorferry_core::transport::Incoming;
use tensorferry_core::wire::{Manifest, Msg, TensorEntry, TRANSFER_MAGIC};

// ---- building the machines --------------------------------------------------

/// A coordinator relaying along `pipeline` under `config`, over tables it
/// owns, sized by `limits`.
pub fn coordinator(
    pipeline: &[&str],
    config: CoordinatorConfig,
    limits: &Limits,
) -> Coordinator<'static> {
    Coordinator::new(pipeline, config, CoordinatorStorage::owned(limits))
        .expect("a valid coordinator")
}

/// An instance started at `now` as `who` under `config`, over tables it
/// owns, sized by `limits`, with the pool `config` gives `who`'s pool size
/// and room for its preallocated slots.
pub fn instance(
    now: Instant,
    who: &InstanceIdentity<'_>,
    config: &InstanceConfig,
    limits: &Limits,
) -> Instance<'static> {
    let pool = config.pool(who.pool_size);
    let storage =
        InstanceStorage::owned(limits, &pool, config.prealloc.count).expect("storage for the pool");
    Instance::new(now, who, config, storage).expect("a valid instance")
}

// ---- the control plane --------------------------------------------------------

/// `payload` (a transfer message) as a channel delivers it: from `from`
/// (empty: a channel that cannot name senders), arrived at `via`.
pub fn incoming<'a>(from: &'a str, via: &'a str, payload: &'a [u8]) -> Incoming<'a> {
    Incoming {
        from,
        user: "",
        via,
        magic: TRANSFER_MAGIC,
        payload,
    }
}

/// Hands `payload`, sent by the instance at `from`, to the coordinator as
/// a channel that names senders does: the coordinator names the peer by
/// that endpoint.
pub fn deliver(
    coord: &mut Coordinator<'_>,
    now: Instant,
    from: &str,
    via: &str,
    payload: &[u8],
) -> Result<PeerId, Unhandled> {
    coord.handle_incoming(now, &incoming(from, via, payload))
}

/// Hands `payload`, sent by the coordinator, to `inst` as its channel
/// delivers it: from the coordinator's endpoint, arrived at the instance's
/// own.
pub fn deliver_to_instance(
    inst: &mut Instance<'_>,
    now: Instant,
    payload: &[u8],
) -> Result<(), InstanceUnhandled> {
    let via = inst.work_endpoint().to_owned();
    let from = inst.coordinator().to_owned();
    inst.handle_incoming(now, &incoming(&from, &via, payload))
}

/// Which of the instances at `endpoints` (in order) a transmit to `to` goes
/// to: the one at the endpoint the coordinator knows `to` by. `None` where
/// it knows none, or no instance is there.
pub fn addressee<'e>(
    coord: &Coordinator<'_>,
    to: PeerId,
    endpoints: impl IntoIterator<Item = &'e str>,
) -> Option<usize> {
    let ep = coord.endpoint_of(to)?;
    endpoints.into_iter().position(|e| e == ep)
}

/// `msg`'s bytes, into `buf` (resized to them).
pub fn encode_into(msg: &Msg<'_>, buf: &mut Vec<u8>) {
    buf.resize(msg.encoded_len(Default::default()), 0);
    let n = msg.encode(buf).expect("sized");
    buf.truncate(n);
}

/// `msg`'s bytes.
pub fn encode(msg: &Msg<'_>) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_into(msg, &mut buf);
    buf
}

// ---- draining a machine --------------------------------------------------------

/// Every message the coordinator has to send now, with its addressee,
/// encoded through `buf`.
pub fn coordinator_outbox(coord: &mut Coordinator<'_>, buf: &mut [u8]) -> Vec<(PeerId, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(t) = coord.poll_transmit(buf) {
        let t = t.expect("transmit buffer large enough");
        out.push((t.to, buf[..t.len].to_vec()));
    }
    out
}

/// Every message `inst` has to send now, encoded through `buf`.
pub fn instance_outbox(inst: &mut Instance<'_>, buf: &mut [u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(n) = inst.poll_transmit(buf) {
        let n = n.expect("transmit buffer large enough");
        out.push(buf[..n].to_vec());
    }
    out
}

/// Every write `inst` asks its data plane for now.
pub fn writes(inst: &mut Instance<'_>) -> Vec<Write> {
    std::iter::from_fn(|| inst.poll_action()).collect()
}

/// Every event `inst` has for its application now.
pub fn instance_events(inst: &mut Instance<'_>) -> Vec<InstanceEvent> {
    std::iter::from_fn(|| inst.poll_event()).collect()
}

/// Every event the coordinator has for its caller now.
pub fn coordinator_events(coord: &mut Coordinator<'_>) -> Vec<CoordinatorEvent> {
    std::iter::from_fn(|| coord.poll_event()).collect()
}

// ---- staging ----------------------------------------------------------------------

/// One `uint8` tensor `x` of `dims` at the slot's start.
pub fn blob(dims: &[u64]) -> TensorEntry<'_> {
    TensorEntry::single("x", dims, "uint8")
}

/// Announces `len` bytes staged under `token` as one `uint8` tensor, with
/// `scalars`: committed, or (`forward_of`) forwarded as the next leg of
/// that delivery.
pub fn commit_blob(
    inst: &mut Instance<'_>,
    now: Instant,
    token: Token,
    len: u64,
    scalars: RawJson<'_>,
    forward_of: Option<Token>,
) -> Result<(), InstanceError> {
    let dims = [len];
    let entries = [blob(&dims)];
    let manifest = Manifest::Entries(&entries);
    match forward_of {
        Some(rx) => inst.forward(now, rx, token, len, &manifest, scalars),
        None => inst.commit(now, token, len, &manifest, scalars),
    }
}

// ---- a drained world ------------------------------------------------------------

/// Nothing in flight at the coordinator, none of the preallocated slots
/// taken, every instance's capacity back. `ctx` prefixes the failures.
pub fn assert_coordinator_drained(coord: &Coordinator<'_>, ctx: &str) {
    assert_eq!(coord.in_flight(), 0, "{ctx}: requests still in flight");
    assert_eq!(
        coord.prealloc_taken(),
        0,
        "{ctx}: preallocated slots still taken at the coordinator"
    );
    for (peer, used) in coord.capacity_in_use() {
        assert_eq!(used, 0, "{ctx}: capacity of {peer:?} not released");
    }
}

/// `inst` holds no request and no preallocated slot in use, and its pool
/// holds only its `prealloc` preallocated slots. `ctx` prefixes the
/// failures.
pub fn assert_instance_drained(inst: &Instance<'_>, prealloc: u64, ctx: &str) {
    assert_eq!(inst.requests_held(), 0, "{ctx}: holds requests: {inst:?}");
    assert_eq!(
        inst.prealloc_in_use(),
        0,
        "{ctx}: preallocated slots in use"
    );
    assert_eq!(
        inst.pool().stats().live_slots,
        prealloc,
        "{ctx}: leaks pool slots: {inst:?}"
    );
}
