//! What happens in the simulation, and how [`Sim`] handles each kind of
//! event: messages arriving, writes landing, timers firing, the
//! application releasing and staging, and instances crashing, stopping,
//! leaving and restarting.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tensorferry_core::handshake::instance::*;
use tensorferry_core::handshake::Instant;
use tensorferry_core::slots::PoolRange;
use tensorferry_core::transport::{Landed, WriteTag};
use tensorferry_core::wire::{decode, Msg};

use super::output::stage_request;
use super::{
    pattern, Forwarding, Sim, COORDINATOR, LANDING, LATE_ARRIVAL, MIN_BLOCK, MS, PER_ROLE,
};
use crate::harness;

#[derive(Debug)]
pub(super) enum Ev {
    ToCoord {
        from: usize,
        inc: u32,
        bytes: Vec<u8>,
    },
    ToInst {
        to: usize,
        inc: u32,
        bytes: Vec<u8>,
    },
    WriteLand {
        from: usize,
        inc: u32,
        token: Token,
        id: String,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: Vec<u8>,
        tag: WriteTag,
        /// It took long to land ([`FaultPlan::delay_write`](tensorferry_core::fault_plan::FaultPlan::delay_write)).
        late: bool,
    },
    /// On a notifying data plane: a write's bytes arrive, after the
    /// sender's completion.
    Arrive {
        id: String,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: Vec<u8>,
        tag: WriteTag,
    },
    CoordTimer,
    InstTimer {
        i: usize,
        inc: u32,
    },
    Release {
        i: usize,
        inc: u32,
        token: Token,
    },
    Stage {
        i: usize,
    },
    Crash {
        i: usize,
    },
    Restart {
        i: usize,
    },
    /// A stop asked for: the instance drains.
    Stop {
        i: usize,
    },
    /// Its grace period is over: it leaves (a restart follows).
    Leave {
        i: usize,
        inc: u32,
    },
}

/// The events to come, by time, then in the order they were scheduled.
#[derive(Default)]
pub(super) struct Queue {
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    seq: u64,
}

impl Queue {
    pub(super) fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.evs.push(Some(ev));
        self.heap.push(Reverse((at, self.seq, self.evs.len() - 1)));
    }

    /// The next event and its time (`None`: taken already).
    pub(super) fn pop(&mut self) -> Option<(u64, Option<Ev>)> {
        let Reverse((at, _, idx)) = self.heap.pop()?;
        Some((at, self.evs[idx].take()))
    }
}

/// Prints `ev`, happening at `now`, for `FERRY_SIM_TRACE`.
pub(super) fn trace(now: u64, ev: &Ev) {
    match ev {
        Ev::ToCoord { from, inc, bytes } => println!(
            "{:>9} inst{from}.{inc} -> coord: {}",
            now / 1000,
            String::from_utf8_lossy(bytes)
        ),
        Ev::ToInst { to, inc, bytes } => println!(
            "{:>9} coord -> inst{to}.{inc}: {}",
            now / 1000,
            String::from_utf8_lossy(bytes)
        ),
        Ev::WriteLand {
            from,
            to,
            to_inc,
            offset,
            id,
            data,
            ..
        } => println!(
            "{:>9} write {id} inst{from} -> inst{to}.{to_inc} @{offset} len {}",
            now / 1000,
            data.len()
        ),
        Ev::Arrive {
            to,
            to_inc,
            offset,
            id,
            data,
            ..
        } => println!(
            "{:>9} bytes of {id} arrive at inst{to}.{to_inc} @{offset} len {}",
            now / 1000,
            data.len()
        ),
        Ev::Crash { i } => println!("{:>9} crash inst{i}", now / 1000),
        Ev::Restart { i } => println!("{:>9} restart inst{i}", now / 1000),
        Ev::Stop { i } => println!("{:>9} stop inst{i}: drain", now / 1000),
        Ev::Leave { i, inc } => println!("{:>9} inst{i}.{inc} leaves", now / 1000),
        _ => {}
    }
}

impl Sim {
    /// Handles `ev`, noting which machines it touched.
    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ToCoord { from, bytes, .. } => self.arrive_at_coordinator(from, &bytes),
            Ev::ToInst { to, inc, bytes } => self.arrive_at_instance(to, inc, &bytes),
            Ev::WriteLand {
                from,
                inc,
                token,
                id,
                to,
                to_inc,
                offset,
                data,
                tag,
                late,
            } => {
                let ok = self.write_lands(id, to, to_inc, offset, data, tag);
                if ok && late && self.nodes[from].inc != inc {
                    self.ledger.out.late_after_crash += 1;
                }
                self.write_completes(from, inc, token, ok);
            }
            Ev::Arrive {
                id,
                to,
                to_inc,
                offset,
                data,
                tag,
            } => self.bytes_arrive(&id, to, to_inc, offset, &data, tag),
            Ev::CoordTimer => {
                self.coord_timer = None;
                self.coord.handle_timeout(Instant(self.now));
                self.touched_coord = true;
            }
            Ev::InstTimer { i, inc } => {
                if self.nodes[i].inc == inc {
                    self.nodes[i].timer = None;
                    if let Some(inst) = self.nodes[i].inst.as_mut() {
                        inst.handle_timeout(Instant(self.now));
                        self.touched.push(i);
                    }
                }
            }
            Ev::Release { i, inc, token } => self.release(i, inc, token),
            Ev::Stage { i } => self.stage(i),
            Ev::Crash { i } => self.crash(i),
            Ev::Stop { i } => self.stop(i),
            Ev::Leave { i, inc } => self.leave(i, inc),
            Ev::Restart { i } => self.restart(i),
        }
    }

    /// A message from instance `from` reaches the coordinator. Messages of
    /// a dead incarnation still in flight arrive like any other, as they
    /// would on a real network.
    fn arrive_at_coordinator(&mut self, from: usize, bytes: &[u8]) {
        let msg = decode(bytes).expect("instances send valid messages");
        let staged = match &msg {
            Msg::Staged(m) => Some(m.request_id),
            Msg::Done(d) if d.staged_for_decoder => Some(d.request_id),
            _ => None,
        };
        if let Some(id) = staged {
            self.ledger
                .first_seen
                .entry((id.to_string(), from / PER_ROLE))
                .or_insert(self.now);
        }
        // The coordinator names the sender by the endpoint the channel
        // reports, as the runtime's does.
        let _ = harness::deliver(
            &mut self.coord,
            Instant(self.now),
            &self.endpoints[from],
            COORDINATOR,
            bytes,
        );
        self.touched_coord = true;
    }

    /// A message from the coordinator reaches incarnation `inc` of
    /// instance `to`, if that one still runs.
    fn arrive_at_instance(&mut self, to: usize, inc: u32, bytes: &[u8]) {
        let node = &mut self.nodes[to];
        if node.inc == inc {
            if let Some(inst) = node.inst.as_mut() {
                // As the instance's channel delivers it; the coordinator
                // sends only what decodes.
                let r = harness::deliver_to_instance(inst, Instant(self.now), bytes);
                assert!(
                    !matches!(
                        r,
                        Err(InstanceUnhandled::Malformed(_) | InstanceUnhandled::Foreign)
                    ),
                    "{r:?}"
                );
                self.touched.push(to);
            }
        }
    }

    /// A write to incarnation `to_inc` of instance `to` completes at its
    /// sender: whether it succeeded. Its bytes land now, or (on a notifying
    /// data plane) later, late, or never.
    fn write_lands(
        &mut self,
        id: String,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: Vec<u8>,
        tag: WriteTag,
    ) -> bool {
        let live = self.receiving(to, to_inc);
        if self.rng.chance(self.faults.plan.fail_write) {
            false
        } else if self.faults.notify {
            // The write completes at the sender; its bytes come later
            // (maybe much later, maybe never).
            if live && !self.rng.chance(self.faults.plan.lose_notice) {
                let delay = if self.rng.chance(self.faults.plan.late_notice) {
                    LANDING / 2 + self.rng.below(LATE_ARRIVAL - LANDING / 2)
                } else {
                    self.rng.below(MS)
                };
                let arrive = Ev::Arrive {
                    id,
                    to,
                    to_inc,
                    offset,
                    data,
                    tag,
                };
                self.queue.push(self.now + delay, arrive);
            }
            true
        } else if live {
            self.land(to, &id, offset, &data);
            true
        } else {
            false
        }
    }

    /// The sender, incarnation `inc` of instance `from`, learns how its
    /// write went.
    fn write_completes(&mut self, from: usize, inc: u32, token: Token, ok: bool) {
        if self.nodes[from].inc == inc {
            if let Some(inst) = self.nodes[from].inst.as_mut() {
                let _ = inst.handle_completion(
                    Instant(self.now),
                    token,
                    if ok { Ok(()) } else { Err("write failed") },
                );
                self.touched.push(from);
            }
        }
    }

    /// On a notifying data plane, a write's bytes arrive at incarnation
    /// `to_inc` of instance `to`.
    fn bytes_arrive(
        &mut self,
        id: &str,
        to: usize,
        to_inc: u32,
        offset: u64,
        data: &[u8],
        tag: WriteTag,
    ) {
        // An instance that left is as good as gone: its pool is about to
        // be unmapped.
        if self.receiving(to, to_inc) {
            self.land(to, id, offset, data);
            // Its data plane reports the arrival at once, whether or not
            // the transfer_ready came yet, naming it as libfabric's wide
            // notices do: by 40 bits of its tag.
            if let Some(inst) = self.nodes[to].inst.as_mut() {
                inst.handle_landed(Instant(self.now), Landed::low_bits(tag.0, 40));
            }
            self.touched.push(to);
        }
    }

    /// Incarnation `inc` of instance `i` runs and has not left.
    fn receiving(&self, i: usize, inc: u32) -> bool {
        self.nodes[i].inc == inc && self.nodes[i].inst.as_ref().is_some_and(|x| !x.is_leaving())
    }

    /// Lands the bytes of a write for `id` at `offset` of instance `to`,
    /// first checking that they lie inside a slot reserved for its
    /// request: by the receiver (reserved, landing, delivered or
    /// quarantined), or (fast path) preallocated and assigned to it by the
    /// coordinator.
    fn land(&mut self, to: usize, id: &str, offset: u64, data: &[u8]) {
        let (seed, endpoint) = (self.seed, &self.endpoints[to]);
        let node = &mut self.nodes[to];
        let Some(inst) = node.inst.as_ref() else {
            return;
        };
        let prealloc = self
            .coord
            .peer_at(endpoint)
            .and_then(|peer| self.coord.prealloc_for(id, peer));
        let inside = |r: PoolRange| r.contains(offset, data.len() as u64);
        assert!(
            inst.slot_for(id).is_some_and(inside) || prealloc.is_some_and(inside),
            "seed {seed}: write for {id} lands at {offset} of instance {endpoint}, outside any slot reserved for it"
        );
        node.pool[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    /// The application of incarnation `inc` of instance `i` is done with
    /// the delivery `token`: it verifies the bytes, and a denoiser passes
    /// the request on (by the seed's way of forwarding) before letting go.
    fn release(&mut self, i: usize, inc: u32, token: Token) {
        let rx = match (self.nodes[i].inc == inc, self.nodes[i].inst.as_ref()) {
            (true, Some(inst)) => inst
                .received(token)
                .map(|rx| (rx.id.to_string(), rx.slot_offset)),
            _ => None,
        };
        let Some((id, slot_offset)) = rx else {
            if self.nodes[i].inc == inc {
                if let Some(inst) = self.nodes[i].inst.as_mut() {
                    // Aborted and gone already, or a stale token.
                    let _ = inst.release(token, None);
                    self.touched.push(i);
                }
            }
            return;
        };
        let (seed, now) = (self.seed, self.now);
        // Verify and forward before letting go.
        let role = i / PER_ROLE;
        let leg = (id.clone(), role - 1);
        let expected = &self.ledger.expected;
        let len = expected.get(&leg).map_or(0, Vec::len);
        let data = self.nodes[i].pool[slot_offset as usize..][..len].to_vec();
        if let Some(want) = expected.get(&leg) {
            assert_eq!(&data, want, "seed {seed}: bytes of {id} differ");
            self.ledger.out.verified += 1;
        }
        // The denoiser passes the request on, transformed.
        let next: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
        let node = &mut self.nodes[i];
        let ledger = &mut self.ledger;
        match self.forwarding {
            _ if role != 1 => {
                if let Some(inst) = node.inst.as_mut() {
                    inst.release(token, None).unwrap();
                }
            }
            Forwarding::NewId => {
                if let Some(inst) = node.inst.as_mut() {
                    inst.release(token, None).unwrap();
                }
                let next_id = format!("{id}/d");
                ledger.staged_at.insert((next_id.clone(), role), now);
                stage_request(node, ledger, &next_id, &next, now, None);
            }
            Forwarding::Forward | Forwarding::SglangDenoisers => {
                ledger.staged_at.insert((id.clone(), role), now);
                let sent = stage_request(node, ledger, &id, &next, now, Some(token));
                if !sent {
                    // No room for the next leg: let go of the input all
                    // the same.
                    if let Some(inst) = node.inst.as_mut() {
                        inst.release(token, None).unwrap();
                    }
                }
            }
        }
        self.touched.push(i);
    }

    /// Encoder `i`'s application stages a new request.
    fn stage(&mut self, i: usize) {
        let id = format!("s{}-r{}", self.seed, self.ledger.staged_count);
        let len = 1 + self.rng.below(12 * MIN_BLOCK) as usize;
        let data = pattern(&id, len);
        if self.nodes[i].inst.is_some() {
            self.ledger.staged_at.insert((id.clone(), 0), self.now);
            stage_request(
                &mut self.nodes[i],
                &mut self.ledger,
                &id,
                &data,
                self.now,
                None,
            );
            self.touched.push(i);
        }
    }

    /// Instance `i` crashes (at most three times a run); it restarts a
    /// little later.
    fn crash(&mut self, i: usize) {
        // One that left is gone already (its restart is due).
        let up = self.nodes[i].inst.as_ref().is_some_and(|x| !x.is_leaving());
        if self.crashes_left[i] > 0 && up {
            self.crashes_left[i] -= 1;
            // What it had staged dies with it.
            let node = &mut self.nodes[i];
            self.ledger.ended_at_sender.extend(node.staged.drain(..));
            node.inst = None;
            node.inc += 1;
            let back = self.now + 5 * MS + self.rng.below(50 * MS);
            self.queue.push(back, Ev::Restart { i });
        }
    }

    /// A stop is asked of instance `i`: it drains, and leaves once its
    /// grace period is over.
    fn stop(&mut self, i: usize) {
        let inc = self.nodes[i].inc;
        if let Some(inst) = self.nodes[i].inst.as_mut() {
            if !inst.is_draining() {
                inst.drain(Instant(self.now));
                self.touched.push(i);
                let grace = self.rng.below(60 * MS);
                self.queue.push(self.now + grace, Ev::Leave { i, inc });
            }
        }
    }

    /// Incarnation `inc` of instance `i` leaves; a restart follows.
    fn leave(&mut self, i: usize, inc: u32) {
        if self.nodes[i].inc == inc {
            if let Some(inst) = self.nodes[i].inst.as_mut() {
                inst.leave(Instant(self.now), "stopped");
                // Its messages go out; then the process ends, and another
                // starts on the endpoint.
                self.touched.push(i);
                let back = self.now + 5 * MS + self.rng.below(50 * MS);
                self.queue.push(back, Ev::Restart { i });
            }
        }
    }

    /// Instance `i` starts again, as a new incarnation, once the one that
    /// left has all its writes in.
    fn restart(&mut self, i: usize) {
        let leaving = self.nodes[i].inst.as_ref().map(Instance::has_left);
        if leaving == Some(false) {
            // Its writes are not all in yet: the process waits for them
            // before it ends.
            self.queue.push(self.now + MS, Ev::Restart { i });
            return;
        }
        if leaving == Some(true) {
            // What is still addressed to the one that left is lost.
            self.nodes[i].inc += 1;
        }
        let inc = self.nodes[i].inc;
        let (inst, session) = self.start_instance(i, inc);
        let node = &mut self.nodes[i];
        node.inst = Some(inst);
        node.session = session;
        node.pool.fill(0);
        node.timer = None;
        self.touched.push(i);
    }
}
