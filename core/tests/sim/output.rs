//! What [`Sim`] does with the machines' output after each event: the
//! coordinator's and the instances' messages go on the faulty wire, the
//! instances' writes onto the data plane, their timers into the queue, and
//! their events into the ledger (checked against the bounds as they come).

use std::time::Duration;

use tensorferry_core::handshake::coordinator::*;
use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::Instant;
use tensorferry_core::json::RawJson;

use super::events::Ev;
use super::{pool_ptr, Ledger, Node, Sim, MS, PER_ROLE};
use crate::harness;

impl Sim {
    /// Puts `bytes` on the wire with the seed's faults: maybe lost, maybe
    /// twice, always after a random delay (so reordered); `ev` makes the
    /// event of their arrival.
    fn send(&mut self, bytes: Vec<u8>, ev: impl Fn(Vec<u8>) -> Ev) {
        if self.rng.chance(self.faults.plan.drop) {
            return;
        }
        let copies = if self.rng.chance(self.faults.plan.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.now + 1 + self.rng.below(self.faults.max_delay());
            self.queue.push(at, ev(bytes.clone()));
        }
    }

    /// The coordinator's messages go out, each to the instance at the
    /// endpoint it names; its events are booked; its timer is set.
    pub(super) fn drain_coordinator(&mut self) {
        for (to, bytes) in harness::coordinator_outbox(&mut self.coord, &mut self.buf) {
            let to = harness::addressee(&self.coord, to, self.endpoints.iter().map(String::as_str))
                .expect("the coordinator answers only endpoints it was sent from");
            let inc = self.nodes[to].inc;
            self.send(bytes, |bytes| Ev::ToInst { to, inc, bytes });
        }
        for e in harness::coordinator_events(&mut self.coord) {
            self.coordinator_event(e);
        }
        if let Some(t) = self.coord.poll_timeout() {
            if self.coord_timer.is_none_or(|c| t.0 < c) {
                let at = t.0.max(self.now);
                self.coord_timer = Some(at);
                self.queue.push(at, Ev::CoordTimer);
            }
        }
    }

    /// A leg ended at the coordinator: once, within the bound (and a
    /// delivered one's phases within its life there).
    fn coordinator_event(&mut self, e: CoordinatorEvent) {
        let (seed, now, bound) = (self.seed, self.now, self.bound);
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

    /// The output of every instance the event touched, in order.
    pub(super) fn drain_instances(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for &i in &touched {
            self.drain_instance(i);
        }
        self.touched = touched;
    }

    /// Instance `i`'s messages go on the wire, its writes onto the data
    /// plane; its deliveries are released a little later, its failed sends
    /// checked against the sender's bound; its timer is set.
    fn drain_instance(&mut self, i: usize) {
        let inc = self.nodes[i].inc;
        let Some(inst) = self.nodes[i].inst.as_mut() else {
            return;
        };
        let outbox = harness::instance_outbox(inst, &mut self.buf);
        let writes = harness::writes(inst);
        for bytes in outbox {
            self.send(bytes, |bytes| Ev::ToCoord {
                from: i,
                inc,
                bytes,
            });
        }
        for w in writes {
            self.post(i, inc, w);
        }
        let inst = self.nodes[i].inst.as_mut().unwrap();
        let mut received = Vec::new();
        for e in harness::instance_events(inst) {
            match e {
                InstanceEvent::Received(token) => received.push(token),
                InstanceEvent::SendFailed { id, .. } => {
                    // Ends within the sender's own staged timeout at most.
                    let key = (id.to_string(), i / PER_ROLE);
                    if let Some(t0) = self.ledger.staged_at.get(&key) {
                        assert!(
                            self.now - t0 <= self.sender_bound,
                            "seed {}: {id} ended at its sender after {} ms",
                            self.seed,
                            (self.now - t0) / MS
                        );
                    }
                    self.ledger.ended_at_sender.insert(key);
                }
                _ => {}
            }
        }
        for token in received {
            let at = self.now + self.rng.below(5 * MS);
            self.queue.push(at, Ev::Release { i, inc, token });
        }
        let inst = self.nodes[i].inst.as_ref().unwrap();
        if let Some(t) = inst.poll_timeout() {
            if self.nodes[i].timer.is_none_or(|c| t.0 < c) {
                let at = t.0.max(self.now);
                self.nodes[i].timer = Some(at);
                self.queue.push(at, Ev::InstTimer { i, inc });
            }
        }
    }

    /// Incarnation `inc` of instance `i` posts write `w`: it lands a
    /// little later at the receiver its session names (a dead session
    /// fails the write).
    fn post(&mut self, i: usize, inc: u32, w: Write) {
        let target = self
            .nodes
            .iter()
            .position(|n| n.inst.is_some() && n.session == w.dest_session.as_str());
        let data = self.nodes[i].pool[w.local_offset as usize..][..w.len as usize].to_vec();
        let late = self.rng.chance(self.faults.plan.delay_write);
        let at = if late {
            let life = super::ns(self.faults.plan.write_lifetime);
            self.now + life / 2 + self.rng.below(life / 2)
        } else {
            self.now + 1 + self.rng.below(3 * MS)
        };
        if self.rng.chance(self.faults.plan.crash_after_write) {
            self.queue.push(self.now + 1, Ev::Crash { i });
        }
        let (to, to_inc, offset) = match target {
            Some(t) => (
                t,
                self.nodes[t].inc,
                w.dest_addr.wrapping_sub(pool_ptr(t, self.nodes[t].inc)),
            ),
            None => (i, u32::MAX, 0),
        };
        let land = Ev::WriteLand {
            from: i,
            inc,
            token: w.token,
            id: w.id.to_string(),
            to,
            to_inc,
            offset,
            data,
            tag: w.tag,
            late,
        };
        self.queue.push(at, land);
    }
}

/// Stages `data` as request `id` at `node` (the next leg of the delivery
/// `forward_of`, if given, which ends with it); false if the instance had no
/// room.
pub(super) fn stage_request(
    node: &mut Node,
    ledger: &mut Ledger,
    id: &str,
    data: &[u8],
    now: u64,
    forward_of: Option<Token>,
) -> bool {
    let leg = node.role;
    let Some(inst) = node.inst.as_mut() else {
        return false;
    };
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
