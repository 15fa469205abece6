//! What [`Sim`] makes of what the world's machines emitted after each
//! step: the messages that reached the coordinator (when each leg was
//! first seen), the coordinator's events (checked against the bounds as
//! they come), the writes posted (onto the simulated data plane), and the
//! instances' events (deliveries released a little later, failed sends
//! checked against the sender's bound).

use std::time::Duration;

use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::Instant;
use tensorferry_core::json::RawJson;
use tensorferry_core::wire::{decode, Msg};

use super::events::{Bytes, Ev};
use super::{pool_ptr, Ledger, Node, Sim, MS, PER_ROLE};
use crate::harness::{self, Posting};

impl Sim {
    /// Books what the last step made the machines emit.
    pub(super) fn book(&mut self) {
        for (from, bytes) in std::mem::take(&mut self.world.arrived) {
            self.arrived(from, &bytes);
        }
        for e in std::mem::take(&mut self.world.coord_events) {
            self.coordinator_event(e);
        }
        for (i, inc, w, p) in std::mem::take(&mut self.world.posted) {
            self.post(i, inc, w, p);
        }
        for (i, e) in std::mem::take(&mut self.world.inst_events) {
            self.instance_event(i, e);
        }
    }

    /// A message of instance `from` reached the coordinator: a leg staged
    /// is first seen there now.
    fn arrived(&mut self, from: usize, bytes: &[u8]) {
        let msg = decode(bytes).expect("instances send valid messages");
        let staged = match &msg {
            Msg::Staged(m) => Some(m.request_id),
            Msg::Done(d) if d.staged_for_decoder => Some(d.request_id),
            _ => None,
        };
        if let Some(id) = staged {
            let now = self.now();
            self.ledger
                .first_seen
                .entry((id.to_string(), from / PER_ROLE))
                .or_insert(now);
        }
    }

    /// A leg ended at the coordinator: once, within the bound (and a
    /// delivered one's phases within its life there).
    fn coordinator_event(&mut self, e: CoordinatorEvent) {
        let (seed, now, bound) = (self.seed, self.now(), self.bound);
        let ledger = &mut self.ledger;
        match e {
            CoordinatorEvent::Delivered { id, leg, timing } => {
                ledger.out.delivered += 1;
                let key = (id.to_string(), leg);
                let t0 = ledger.first_seen.get(&key).copied().unwrap_or(now);
                // The phases follow one another within the leg's life at
                // the coordinator.
                let phases = timing.queued + timing.written + timing.consumed;
                assert!(
                    phases <= Duration::from_nanos(now - t0),
                    "seed {seed}: {id} (leg {leg}) phases {timing:?} exceed its {} ns",
                    now - t0
                );
                assert!(
                    ledger.ended_at_coord.insert(key),
                    "seed {seed}: {id} (leg {leg}) ended twice"
                );
                assert!(
                    now - t0 <= bound,
                    "seed {seed}: {id} took {} ms",
                    (now - t0) / MS
                );
            }
            CoordinatorEvent::Failed { id, leg, reason } => {
                ledger.out.failed += 1;
                let key = (id.to_string(), leg);
                let t0 = ledger.first_seen.get(&key).copied().unwrap_or(now);
                ledger.ended_at_coord.insert(key);
                *ledger
                    .out
                    .reasons
                    .entry(reason.as_str().to_string())
                    .or_default() += 1;
                assert!(
                    now - t0 <= bound,
                    "seed {seed}: {id} failed after {} ms",
                    (now - t0) / MS
                );
            }
            CoordinatorEvent::Registered { .. }
            | CoordinatorEvent::Refused { .. }
            | CoordinatorEvent::Deregistered { .. } => {}
        }
    }

    /// Instance `i`'s deliveries are released a little later; a send that
    /// failed ended within the sender's bound.
    fn instance_event(&mut self, i: usize, e: InstanceEvent) {
        match e {
            InstanceEvent::Received(token) => {
                let inc = self.world.incs[i];
                let after = self.rng.below(5 * MS);
                self.world.schedule(after, Ev::Release { i, inc, token });
            }
            InstanceEvent::SendFailed { id, .. } => {
                // Ends within the sender's own staged timeout at most.
                let key = (id.to_string(), i / PER_ROLE);
                if let Some(t0) = self.ledger.staged_at.get(&key) {
                    assert!(
                        self.now() - t0 <= self.sender_bound,
                        "seed {}: {id} ended at its sender after {} ms",
                        self.seed,
                        (self.now() - t0) / MS
                    );
                }
                self.ledger.ended_at_sender.insert(key);
            }
            _ => {}
        }
    }

    /// Incarnation `inc` of instance `i` posted write `w`: it lands when
    /// the wire said, at the receiver its session names (a dead session
    /// fails the write); its sender may crash just after.
    fn post(&mut self, i: usize, inc: u32, w: Write, posting: Posting) {
        let up = &self.world.up;
        let target = self
            .nodes
            .iter()
            .enumerate()
            .position(|(n, node)| up[n] && node.session == w.dest_session.as_str());
        let data = self.nodes[i].pool[w.local_offset as usize..][..w.len as usize].to_vec();
        let Posting {
            after,
            late,
            crash_sender,
        } = posting;
        if crash_sender {
            self.world.schedule(1, Ev::Crash { i });
        }
        let (to, to_inc, offset) = match target {
            Some(t) => {
                let to_inc = self.world.incs[t];
                (t, to_inc, w.dest_addr.wrapping_sub(pool_ptr(t, to_inc)))
            }
            None => (i, u32::MAX, 0),
        };
        let bytes = Bytes {
            id: w.id.to_string(),
            to,
            to_inc,
            offset,
            data,
            tag: w.tag,
        };
        let land = Ev::WriteLand {
            from: i,
            inc,
            token: w.token,
            bytes,
            late,
        };
        self.world.schedule(after, land);
    }
}

/// Stages `data` as request `id` at `inst` (in `node`'s place) (the next leg of the delivery
/// `forward_of`, if given, which ends with it); false if the instance had no
/// room.
pub(super) fn stage_request(
    inst: &mut Instance<'static>,
    node: &mut Node,
    ledger: &mut Ledger,
    id: &str,
    data: &[u8],
    now: u64,
    forward_of: Option<Token>,
) -> bool {
    let leg = node.role;
    let Ok((token, offset)) = inst.stage(id, data.len() as u64) else {
        return false;
    };
    node.pool[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    let scalars = RawJson::parse_object(r#"{"step":1,"cfg":1e-05}"#).unwrap();
    let len = data.len() as u64;
    harness::commit_blob(inst, Instant(now), token, len, scalars, forward_of).unwrap();
    ledger.expected.insert((id.to_string(), leg), data.to_vec());
    node.staged.push((id.to_string(), leg));
    ledger.staged_count += 1;
    true
}
