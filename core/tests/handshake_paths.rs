//! Each documented path of the handshake, walked step by step with a
//! coordinator and real instances exchanging encoded messages. The world
//! they walk in (the machines, and the synchronous pump between them) is in
//! `paths/`, in the harness's `World` (`tensorferry-harness`, which the
//! simulation and the fuzz target drive too) over its lossless wire. The paths themselves are in `handshake_paths/`, one
//! module a topic; what more than one of them uses is here.

use tensorferry_harness as harness;
#[macro_use]
mod paths;

#[path = "handshake_paths/failures.rs"]
mod failures;
#[path = "handshake_paths/handoff.rs"]
mod handoff;
#[path = "handshake_paths/landing.rs"]
mod landing;
#[path = "handshake_paths/leaving.rs"]
mod leaving;
#[path = "handshake_paths/peers.rs"]
mod peers;
#[path = "handshake_paths/registration.rs"]
mod registration;
#[path = "handshake_paths/sglang_head.rs"]
mod sglang_head;

use harness::blob;
use paths::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Ignored, Instant};
use tensorferry_core::json::RawJson;
use tensorferry_core::wire::{decode, Manifest, Msg, TensorEntry};

/// The `error` of the one message of type `ty` an instance sent,
/// unescaped.
fn error_sent(w: &World<'_>, ty: &str) -> String {
    let texts: Vec<_> = w
        .from_instances
        .iter()
        .filter(|t| t.contains(&format!(r#""msg_type":"{ty}""#)))
        .collect();
    let [text] = texts[..] else {
        panic!("{texts:?}")
    };
    let error = match decode(text.as_bytes()).unwrap() {
        Msg::Pushed(p) => p.error,
        Msg::Done(d) => d.error,
        other => panic!("{other:?}"),
    };
    let mut buf = [0u8; 1024];
    error.unwrap().unescape_into(&mut buf).unwrap().to_owned()
}

// ---- sglang's head and its flow -------------------------------------------
// (Here, not in `sglang_head`: the leaving tests use these too.)

/// An instance configured for sglang's head (holds an ALLOC 50 ms).
fn sglang_instance(role: &'static str, session: &'static str) -> Instance<'static> {
    sglang_instance_at(role, session, "tcp://sg:1")
}

fn sglang_instance_at(
    role: &'static str,
    session: &'static str,
    endpoint: &'static str,
) -> Instance<'static> {
    let how = Serving {
        head: Head::Sglang,
        ..Serving::FERRY
    };
    instance_serving(role, session, endpoint, how)
}

/// Every message `inst` has to send now, as text.
fn outbox(inst: &mut Instance<'_>) -> Vec<String> {
    let mut buf = vec![0u8; 16 * 1024];
    harness::instance_outbox(inst, &mut buf)
        .into_iter()
        .map(|m| String::from_utf8(m).unwrap())
        .collect()
}

fn feed(inst: &mut Instance<'_>, now_ms: u64, json: &str) -> Result<(), Ignored> {
    inst.handle(Instant(now_ms * MS), &decode(json.as_bytes()).unwrap())
}

/// A denoiser (serving under `head`) between a ferry encoder and decoder,
/// around a ferry coordinator: `r1` is delivered to the denoiser, which
/// forwards it. Returns the world and where the forward's messages start.
fn forward_world(head: Head) -> (World<'static>, usize) {
    forward_world_with(head, |_| {})
}

/// [`forward_world`], with `before_forward` run once `r1` is delivered.
fn forward_world_with(
    head: Head,
    before_forward: impl FnOnce(&mut World<'static>),
) -> (World<'static>, usize) {
    let denoiser = match head {
        Head::Ferry => instance("denoiser", "den-0", "tcp://den:1"),
        Head::Sglang => sglang_instance_at("denoiser", "den-0", "tcp://den:1"),
    };
    let insts = vec![
        instance("encoder", "enc-0", "tcp://enc:1"),
        denoiser,
        instance("decoder", "dec-0", "tcp://dec:1"),
    ];
    let pipeline = ["encoder", "denoiser", "decoder"];
    let mut w = World::new(coordinator_for(8, &pipeline), insts);
    w.stage(0, "r1", 6 * KIB);
    let [rx] = w.received(1)[..] else {
        panic!("{:?}", w.inst_events)
    };
    before_forward(&mut w);
    // The denoiser stages its output under the same id and forwards.
    let (next, _) = w.insts[1].stage("r1", 4 * KIB).unwrap();
    let dims = [4 * KIB];
    let entries = [TensorEntry {
        field: "latents".into(),
        ..blob(&dims)
    }];
    let before = w.from_instances.len();
    let scalars = RawJson::parse_object(r#"{"step":2}"#).unwrap();
    let manifest = Manifest::Entries(&entries);
    w.insts[1]
        .forward(w.now, rx, next, 4 * KIB, &manifest, scalars)
        .unwrap();
    assert_eq!(w.insts[1].received(rx).map(|r| r.id), None, "released");
    w.pump();
    (w, before)
}
