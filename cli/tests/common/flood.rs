//! Forged traffic against running processes: raw ZeroMQ sockets of a
//! forger's, floods of forged protocol messages, and the checks that they
//! changed nothing (a receiver's pool top untouched, every hand-off done).

use std::time::{Duration, Instant};

use serde_json::Value;
use tensorferry_zmq::zmq;

use super::{num, Procs};

/// The first frame of every transfer message.
pub const MAGIC: &[u8] = b"__transfer__";

/// A raw PUSH socket, as a forger would use.
pub fn forger(ctx: &zmq::Context, to: &str) -> zmq::Socket {
    let s = ctx.socket(zmq::PUSH).unwrap();
    s.set_sndhwm(100_000).unwrap();
    s.set_linger(0).unwrap();
    s.connect(to).unwrap();
    s
}

/// The top of a receiver's pool, which the buddy allocator (lowest block
/// first) gives out only when the pool is nearly full: no hand-off of these
/// tests writes there, so forged writes aim at it.
pub const TOP: u64 = 64 << 20;

/// The receiver's session (from its `registered` line) and the address
/// forged pushes name: 1 MiB below the end of its pool.
pub fn aim(registered: &str) -> (String, u64) {
    let v: Value = serde_json::from_str(registered).unwrap();
    let session = v["session_id"].as_str().unwrap().to_owned();
    // shm:<name>@<hex base>+<len>
    let (base, len) = session
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('+'))
        .and_then(|(hex, len)| {
            let base = u64::from_str_radix(hex.trim_start_matches("0x"), 16).ok()?;
            Some((base, len.parse::<u64>().ok()?))
        })
        .unwrap_or_else(|| panic!("no base and length in {session}"));
    (session, base + len - (1 << 20))
}

/// Bytes of the top of the receiver's pool that are not zero (a fresh pool
/// is all zeros).
pub fn written_at_the_top(p: &Procs, registered: &str) -> usize {
    let pid = num(registered, "pid");
    let pool = std::fs::read(format!("/dev/shm/{}-{pid}-0", p.shm_prefix)).unwrap();
    let top = pool.len() - TOP as usize;
    pool[top..].iter().filter(|&&b| b != 0).count()
}

/// Waits for the encoder to report `n` sent and none failed, and for the
/// coordinator to report each delivered.
pub fn await_handoffs(p: &mut Procs, encoder: usize, coordinator: usize, n: u64) {
    let encoded = p.wait_for(encoder, "\"event\":\"encoded\"", 120);
    assert_eq!(
        (num(&encoded, "sent"), num(&encoded, "send_failed")),
        (n, 0),
        "{encoded}"
    );
    for _ in 0..n {
        let line = p.wait_for(coordinator, "\"leg\"", 60);
        assert!(line.contains("\"event\":\"delivered\""), "{line}");
    }
}

/// Sends `rounds` of forged messages on each of `targets` for about two
/// seconds; pushes aim at `dest` in `session`. With `known`, pushes,
/// readies and dones name ids in flight (`encoder-<k>`); without, ids
/// nobody holds, and readies name no slot. Returns how many went out.
pub fn flood(targets: &[zmq::Socket], session: &str, dest: u64, known: bool) -> usize {
    let start = Instant::now();
    let mut sent = 0;
    let mut k = 0usize;
    while start.elapsed() < Duration::from_secs(2) {
        for t in targets {
            for _ in 0..100 {
                k += 1;
                let ghost = format!("ghost-{k}");
                let n = (k % 40) as u64;
                // The size a push must name to be taken: the forger knows
                // the workload (its sizes are seeded).
                let size = tensorferry_cli::pipeline::data::random_size(3, n, 65536);
                let id = if known {
                    format!("encoder-{n}")
                } else {
                    ghost.clone()
                };
                // A ready for an unknown id names no slot of the instance
                // (one that names a preallocated slot is an attack the
                // allow-list must stop: see the trust model in docs/src/operating.md).
                let slot = if known { 0 } else { 12345 };
                for msg in [
                    serde_json::json!({"msg_type": "transfer_alloc", "request_id": ghost, "data_size": 1 << 20, "source_role": "encoder"}),
                    serde_json::json!({"msg_type": "transfer_push", "request_id": id, "dest_session_id": session, "dest_addr": dest, "transfer_size": size}),
                    serde_json::json!({"msg_type": "transfer_ready", "request_id": id, "slot_offset": slot, "manifest": {}}),
                    serde_json::json!({"msg_type": "transfer_staged", "request_id": ghost, "data_size": 10, "session_id": "x"}),
                    serde_json::json!({"msg_type": "transfer_done", "request_id": id}),
                ] {
                    if t.send_multipart([MAGIC, msg.to_string().as_bytes()], zmq::DONTWAIT)
                        .is_ok()
                    {
                        sent += 1;
                    }
                }
                if k % 1000 == 0 {
                    let _ = t.send_multipart([MAGIC, b"{not json"], zmq::DONTWAIT);
                }
            }
        }
    }
    sent
}

/// Floods `targets` (as `flood` does) while the encoder `encoder` makes
/// its `n` hand-offs through the coordinator `coordinator`, checks that
/// the flood was one (over 1000 messages) and that every hand-off was
/// made, then closes the forgers' sockets.
#[allow(clippy::too_many_arguments)]
pub fn flood_through_handoffs(
    p: &mut Procs,
    targets: Vec<zmq::Socket>,
    session: &str,
    dest: u64,
    known: bool,
    encoder: usize,
    coordinator: usize,
    n: u64,
) {
    let forged = flood(&targets, session, dest, known);
    assert!(forged > 1000, "only {forged} forged messages sent");
    await_handoffs(p, encoder, coordinator, n);
    drop(targets);
}

/// Floods `targets` with messages naming the hand-offs of the denoiser
/// `d` (its `registered` line) while the encoder `e` makes 200 hand-offs
/// through the coordinator `c`, and checks that none of it reached a
/// state machine: nothing was ignored or dropped as malformed, and every
/// byte the denoiser got was the encoder's.
pub fn flood_of_known_ids_changes_nothing(
    p: &mut Procs,
    targets: Vec<zmq::Socket>,
    registered: &str,
    (d, e, c): (usize, usize, usize),
) {
    let (session, dest) = aim(registered);
    flood_through_handoffs(p, targets, &session, dest, true, e, c, 200);
    assert_eq!(written_at_the_top(p, registered), 0);
    finish_untouched(p, d, e, c, 200);
}

/// Ends the denoiser `d`, the encoder `e` and the coordinator `c` of a run
/// of `n` hand-offs under forged or strangers' traffic, and checks that
/// none of it reached a state machine: every hand-off verified, nothing
/// ignored or dropped as malformed anywhere.
pub fn finish_untouched(p: &mut Procs, d: usize, e: usize, c: usize, n: u64) {
    let s = p.finish(d);
    assert_eq!((num(&s, "verified"), num(&s, "mismatches")), (n, 0), "{s}");
    assert_eq!((num(&s, "ignored"), num(&s, "bad_frames")), (0, 0), "{s}");
    let s = p.finish(e);
    assert_eq!((num(&s, "ignored"), num(&s, "bad_frames")), (0, 0), "{s}");
    let s = p.finish(c);
    assert_eq!(num(&s, "ignored"), 0, "{s}");
}
