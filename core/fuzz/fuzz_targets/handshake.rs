//! Arbitrary message sequences, from any peer, fed to a coordinator and two
//! instances (encoder, denoiser) that also talk to each other over the
//! harness's byte-driven wire (the input's bytes lose, duplicate, delay and
//! so reorder their messages, and fail, complete or hold their writes),
//! with the application staging, releasing and completing writes at
//! random. No panic; and once every application handle is let go and time
//! has run far enough, nothing is left in flight, held, parked or leaked.
#![no_main]

// The machines are built, and their world run, as the path tests and the
// simulation do theirs.
use tensorferry_harness as harness;

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::{Instant, Limits, PeerId};
use tensorferry_core::json::{JsonStr, RawJson};
use tensorferry_core::slots::BuddyConfig;
use tensorferry_core::wire::*;
use tensorferry_harness::{Bytes, World};

const IDS: [&str; 4] = ["a", "b", "c", "d"];
const SESSIONS: [&str; 4] = ["enc", "den", "x", ""];
const ROLES: [&str; 3] = ["encoder", "denoiser", "decoder"];
const POOL: BuddyConfig = BuddyConfig {
    pool_size: 64 * 1024,
    min_block: 4096,
    pool_id: 0,
};

/// A request's leg as a staged and its alloc both name it: the request,
/// its size, and one session.
#[derive(Arbitrary, Debug)]
struct Leg {
    id: u8,
    size: u32,
    session: u8,
}

#[derive(Arbitrary, Debug)]
enum FMsg {
    Register {
        role: u8,
        session: u8,
        prealloc: bool,
        endpoint: bool,
    },
    /// The sender's session.
    Staged(Leg),
    /// The receiver's session.
    Alloc(Leg),
    Allocated {
        id: u8,
        session: u8,
        offset: u32,
        size: u32,
    },
    Reject {
        id: u8,
        retryable: bool,
    },
    Push {
        id: u8,
        session: u8,
        addr: u64,
        size: u32,
    },
    Pushed {
        id: u8,
        success: bool,
    },
    Ready {
        id: u8,
        offset: u32,
        fits: bool,
        session: u8,
    },
    Done {
        id: u8,
        error: bool,
        /// sglang's forward: the next leg staged in the same message, from
        /// this session.
        forward: Option<u8>,
    },
    Abort {
        id: u8,
        role: u8,
    },
    Ack {
        session: u8,
        accepted: bool,
    },
    Deregister {
        session: u8,
        draining: bool,
    },
}

#[derive(Arbitrary, Debug)]
enum Op {
    ToCoord {
        from: u8,
        msg: FMsg,
    },
    /// A message as a channel delivers it, named by an endpoint (one of a
    /// few, or none), arriving at a role's endpoint or another; `raw`:
    /// the bytes as given, else a well-formed message.
    Incoming {
        from: u8,
        via: u8,
        /// The identity the channel authenticated the sender as (one of a
        /// few keys, or none).
        user: u8,
        msg: FMsg,
        raw: Option<Vec<u8>>,
        magic: bool,
    },
    /// A peer's connection closed.
    Gone {
        from: u8,
    },
    ToInst {
        to: bool,
        msg: FMsg,
    },
    Stage {
        id: u8,
        size: u16,
    },
    Release {
        nth: u8,
        error: bool,
    },
    Complete {
        nth: u8,
        ok: bool,
    },
    Advance {
        ms: u8,
    },
    /// An instance lost its coordinator.
    Reregister {
        who: bool,
    },
    /// An instance drains (a stop asked for).
    Drain {
        who: bool,
    },
    /// An instance leaves.
    Leave {
        who: bool,
    },
    /// The denoiser's data plane reports a write landed: one posted so far
    /// (before or after its ready, by `bits` of its tag), or (`bogus`)
    /// any tag.
    Land {
        nth: u8,
        bits: u8,
        bogus: Option<u64>,
    },
    Pump,
}

fn encode(m: &FMsg, buf: &mut Vec<u8>) {
    let id = |i: &u8| JsonStr::plain(IDS[*i as usize % IDS.len()]);
    let session = |i: &u8| JsonStr::plain(SESSIONS[*i as usize % SESSIONS.len()]);
    let slots = [PreallocatedSlot {
        offset: 0,
        size: 8192,
        slot_id: 0,
        addr: 0x1000,
    }];
    let dims = [4096u64];
    let small = [harness::blob(&dims)];
    let big_dims = [1u64 << 40];
    let big = [TensorEntry {
        shape: Shape::Dims(&big_dims),
        ..small[0]
    }];
    let msg = match m {
        FMsg::Register {
            role,
            session: s,
            prealloc,
            endpoint,
        } => Msg::Register(Register {
            role: JsonStr::plain(ROLES[*role as usize % 3]),
            session_id: session(s),
            pool_ptr: 0x1000,
            pool_size: 65536,
            work_endpoint: JsonStr::plain(if *endpoint {
                "tcp://den"
            } else {
                "tcp://other"
            }),
            preallocated_slots: SlotList::Slots(if *prealloc { &slots } else { &[] }),
            write_lifetime_ms: u64::from(*role),
        }),
        FMsg::Staged(leg) => Msg::Staged(Staged {
            request_id: id(&leg.id),
            data_size: u64::from(leg.size),
            session_id: session(&leg.session),
            manifest: Manifest::Entries(&small),
            ..Staged::default()
        }),
        FMsg::Alloc(leg) => Msg::Alloc(Alloc {
            request_id: id(&leg.id),
            data_size: u64::from(leg.size),
            source_role: "encoder".into(),
            receiver_session_id: session(&leg.session),
        }),
        FMsg::Allocated {
            id: i,
            session: s,
            offset,
            size,
        } => Msg::Allocated(Allocated {
            request_id: id(i),
            session_id: session(s),
            pool_ptr: 0x1000,
            slot_offset: u64::from(*offset),
            slot_size: u64::from(*size),
        }),
        FMsg::Reject { id: i, retryable } => Msg::AllocReject(AllocReject {
            request_id: id(i),
            retryable: *retryable,
            ..AllocReject::default()
        }),
        FMsg::Push {
            id: i,
            session: s,
            addr,
            size,
        } => Msg::Push(Push {
            request_id: id(i),
            dest_session_id: session(s),
            dest_addr: *addr,
            transfer_size: u64::from(*size),
        }),
        FMsg::Pushed { id: i, success } => Msg::Pushed(Pushed {
            request_id: id(i),
            success: *success,
            error: None,
        }),
        FMsg::Ready {
            id: i,
            offset,
            fits,
            session: s,
        } => Msg::Ready(Ready {
            request_id: id(i),
            manifest: Manifest::Entries(if *fits { &small } else { &big }),
            slot_offset: u64::from(*offset),
            scalar_fields: RawJson::EMPTY_OBJECT,
            dest_session_id: session(s),
            prealloc_slot_id: None,
        }),
        FMsg::Done {
            id: i,
            error,
            forward,
        } => Msg::Done(Done {
            request_id: id(i),
            error: error.then_some("x".into()),
            staged_for_decoder: forward.is_some(),
            session_id: forward.as_ref().map(session).unwrap_or_default(),
            data_size: 1024,
            manifest: Manifest::Entries(&small),
            ..Done::default()
        }),
        FMsg::Abort { id: i, role } => Msg::Abort(Abort {
            request_id: id(i),
            reason: "fuzz".into(),
            // 3: none (a coordinator that does not say).
            source_role: JsonStr::plain(["encoder", "denoiser", "decoder", ""][*role as usize % 4]),
        }),
        FMsg::Ack {
            session: s,
            accepted,
        } => Msg::RegisterAck(RegisterAck {
            session_id: session(s),
            role: "encoder".into(),
            accepted: *accepted,
            error: None,
        }),
        FMsg::Deregister {
            session: s,
            draining,
        } => Msg::Deregister(Deregister {
            session_id: session(s),
            draining: *draining,
            reason: "fuzz".into(),
        }),
    };
    harness::encode_into(&msg, buf);
}

/// The instances' table sizes.
const LIMITS: Limits = Limits {
    requests: 6,
    nested_per_request: 256,
    tombstones: 8,
    members: 0,
    prealloc_per_member: 0,
};

fn instance(role: &'static str, session: &'static str) -> Instance<'static> {
    let who = InstanceIdentity {
        role,
        session_id: session,
        work_endpoint: if role == "denoiser" {
            "tcp://den"
        } else {
            "tcp://enc"
        },
        coordinator: "tcp://coordinator",
        pool_ptr: 0x1000,
        pool_size: POOL.pool_size,
        // The denoiser's data plane reports arrivals; the encoder's
        // completions mean delivery.
        delivery_complete: role != "denoiser",
        write_lifetime: Duration::ZERO,
    };
    let config = InstanceConfig {
        min_block: POOL.min_block,
        prealloc: Prealloc {
            count: 1,
            size: 8192,
        },
        register_retry: Duration::from_millis(5),
        staged_timeout: Duration::from_millis(200),
        reserved_timeout: Duration::from_millis(200),
        quarantine: Duration::from_millis(5),
        message_delay: Duration::ZERO,
        landing_timeout: Duration::from_millis(10),
        head: tensorferry_core::handshake::instance::Head::Ferry,
        alloc_hold: Duration::from_secs(20),
    };
    harness::instance(Instant(0), &who, &config, &LIMITS)
}

/// The operations, and the bytes that choose the fates of the machines'
/// own messages and writes.
#[derive(Arbitrary, Debug)]
struct Input {
    wire: Vec<u8>,
    ops: Vec<Op>,
}

/// What the application holds after the world moved: deliveries to let
/// go, writes to complete, the tags of the writes posted (newest last).
#[derive(Default)]
struct App {
    held: Vec<(usize, Token)>,
    writes: Vec<(usize, Token)>,
    posted: Vec<tensorferry_core::transport::WriteTag>,
}

impl App {
    fn take(&mut self, w: &mut World<'_, Bytes>) {
        for (i, e) in w.inst_events.drain(..) {
            if let InstanceEvent::Received(t) = e {
                self.held.push((i, t));
            }
        }
        w.coord_events.clear();
        for (i, write) in w.pending.drain(..) {
            self.writes.push((i, write.token));
            if self.posted.len() == 64 {
                self.posted.remove(0);
            }
            self.posted.push(write.tag);
        }
    }
}

fuzz_target!(|input: Input| {
    let config = CoordinatorConfig {
        policy: Policy::MostFreeSlots,
        capacity_per_instance: 2,
        timeouts: Timeouts {
            queued: Duration::from_millis(50),
            alloc: Duration::from_millis(10),
            push: Duration::from_millis(10),
            done: Duration::from_millis(10),
        },
        retry_backoff: Duration::from_millis(1),
        max_attempts: 3,
        quarantine: Duration::from_millis(5),
        message_delay: Duration::ZERO,
        max_write_lifetime: CoordinatorConfig::FERRY.max_write_lifetime,
        late_done_wait: Duration::from_millis(30),
    };
    let limits = Limits {
        requests: 4,
        members: 4,
        prealloc_per_member: 2,
        ..LIMITS
    };
    let mut coord = harness::coordinator(&ROLES, config, &limits);
    // Messages on a channel that cannot name senders are judged by the
    // endpoint they arrive at.
    coord
        .set_role_endpoint(ROLES[0], "tcp://c:enc")
        .expect("a role of the pipeline");
    coord
        .set_role_endpoint(ROLES[1], "tcp://c:den")
        .expect("a role of the pipeline");
    let insts = vec![instance("encoder", "enc"), instance("denoiser", "den")];
    let mut w = World::with_wire(coord, insts, Bytes::new(input.wire), false);
    let mut app = App::default();
    app.take(&mut w);

    let mut bytes = Vec::new();
    for op in input.ops.into_iter().take(300) {
        let now = w.now;
        match op {
            Op::ToCoord { from, msg } => {
                encode(&msg, &mut bytes);
                let m = decode(&bytes).expect("own encoding decodes");
                let _ = w.coord.sender_of(&m, Some(usize::from(from % 4)));
                let _ = w.coord.sender_of(&m, None);
                let _ = w.coord.handle(now, PeerId(u32::from(from % 4) + 1), &m);
            }
            Op::Incoming {
                from,
                via,
                user,
                msg,
                raw,
                magic,
            } => {
                const FROM: [&str; 5] = ["", "tcp://enc", "tcp://den", "tcp://x:1", "tcp://x:2"];
                const VIA: [&str; 3] = ["tcp://c:enc", "tcp://c:den", "tcp://c:other"];
                const USER: [&str; 3] = ["", "key-a", "key-b"];
                let payload = match raw {
                    Some(r) => r,
                    None => {
                        encode(&msg, &mut bytes);
                        bytes.clone()
                    }
                };
                let (magic, payload): (&[u8], &[u8]) = if magic {
                    (tensorferry_core::wire::TRANSFER_MAGIC, &payload)
                } else {
                    // A role's result, or any other message.
                    (&payload, b"")
                };
                let m = tensorferry_core::transport::Incoming {
                    from: FROM[usize::from(from) % FROM.len()],
                    via: VIA[usize::from(via) % VIA.len()],
                    user: USER[usize::from(user) % USER.len()],
                    magic,
                    payload,
                };
                let coord = &mut w.coord;
                if let Ok(peer) = coord.handle_incoming(now, &m) {
                    // A named peer is answered at its endpoint.
                    assert_eq!(
                        coord
                            .peer_at(coord.endpoint_of(peer).unwrap_or(""))
                            .is_some(),
                        coord.endpoint_of(peer).is_some()
                    );
                }
            }
            Op::Gone { from } => {
                const FROM: [&str; 4] = ["tcp://enc", "tcp://den", "tcp://x:1", ""];
                let _ = w
                    .coord
                    .handle_gone(now, FROM[usize::from(from) % FROM.len()]);
            }
            Op::ToInst { to, msg } => {
                encode(&msg, &mut bytes);
                decode(&bytes).expect("own encoding decodes");
                let _ = harness::deliver_to_instance(&mut w.insts[usize::from(to)], now, &bytes);
            }
            Op::Stage { id, size } => {
                let i = usize::from(id % 2);
                if let Ok((token, _)) =
                    w.insts[i].stage(IDS[usize::from(id) % IDS.len()], u64::from(size) + 1)
                {
                    let len = u64::from(size) + 1;
                    let scalars = RawJson::EMPTY_OBJECT;
                    let _ = harness::commit_blob(&mut w.insts[i], now, token, len, scalars, None);
                }
            }
            Op::Release { nth, error } if !app.held.is_empty() => {
                let (i, t) = app.held.swap_remove(usize::from(nth) % app.held.len());
                let _ = w.insts[i].release(t, error.then_some("app error"));
            }
            Op::Complete { nth, ok } if !app.writes.is_empty() => {
                let (i, t) = app.writes.swap_remove(usize::from(nth) % app.writes.len());
                let r = if ok { Ok(()) } else { Err("failed") };
                let _ = w.insts[i].handle_completion(now, t, r);
            }
            Op::Reregister { who } => w.insts[usize::from(who)].reregister(now),
            Op::Drain { who } => w.insts[usize::from(who)].drain(now),
            Op::Leave { who } => w.insts[usize::from(who)].leave(now, "fuzz"),
            Op::Land { nth, bits, bogus } => {
                let posted = &app.posted;
                let tag = match bogus {
                    Some(t) => Some(t),
                    None => (!posted.is_empty()).then(|| posted[usize::from(nth) % posted.len()].0),
                };
                if let Some(tag) = tag {
                    let landed =
                        tensorferry_core::transport::Landed::low_bits(tag, u32::from(bits));
                    let _ = w.insts[1].handle_landed(now, landed);
                }
            }
            // Messages in transit until then arrive; the timers fire
            // late, as an event loop's that overslept.
            Op::Advance { ms } => w.oversleep(now + Duration::from_millis(u64::from(ms))),
            _ => {}
        }
        w.pump();
        app.take(&mut w);
    }

    // Let go of everything, then let time run out every wait, over a wire
    // that no longer loses or delays anything (the bytes' fates are spent).
    w.wire = Bytes::default();
    for _ in 0..100 {
        let now = w.now;
        for (i, t) in app.held.drain(..) {
            let _ = w.insts[i].release(t, None);
        }
        for (i, t) in app.writes.drain(..) {
            let _ = w.insts[i].handle_completion(now, t, Ok(()));
        }
        w.oversleep(now + Duration::from_millis(20));
        app.take(&mut w);
    }
    w.assert_drained(1, "fuzz");
});
