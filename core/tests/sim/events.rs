//! The simulation's own events on the world's clock, and how [`Sim`]
//! handles each: its data plane's writes landing and their bytes arriving,
//! the applications releasing and staging, and instances crashing,
//! stopping, leaving and restarting. (Messages and timers are the
//! world's.)

use tensorferry_core::handshake::instance::*;
use tensorferry_core::slots::PoolRange;
use tensorferry_core::transport::{Landed, WriteTag};

use super::output::stage_request;
use super::{pattern, Forwarding, Sim, LANDING, LATE_ARRIVAL, MIN_BLOCK, MS, PER_ROLE};

/// A write's bytes on their way: for which request, to which
/// incarnation of which instance, where in its pool, under which tag.
#[derive(Debug)]
pub(super) struct Bytes {
    pub(super) id: String,
    pub(super) to: usize,
    pub(super) to_inc: u32,
    pub(super) offset: u64,
    pub(super) data: Vec<u8>,
    pub(super) tag: WriteTag,
}

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Bytes {
            id,
            to,
            to_inc,
            offset,
            data,
            ..
        } = self;
        let len = data.len();
        write!(f, "{id} to inst{to}.{to_inc} @{offset} len {len}")
    }
}

#[derive(Debug)]
pub(super) enum Ev {
    /// Incarnation `inc` of instance `from` wrote `bytes`: the write
    /// completes at the sender (and, where completions mean delivery, its
    /// bytes land).
    WriteLand {
        from: usize,
        inc: u32,
        token: Token,
        bytes: Bytes,
        /// It took long to land
        /// ([`FaultPlan::delay_write`](tensorferry_core::fault_plan::FaultPlan::delay_write)).
        late: bool,
    },
    /// On a notifying data plane: a write's bytes arrive, after the
    /// sender's completion.
    Arrive(Bytes),
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

/// Prints `ev`, happening at `now`, for `FERRY_SIM_TRACE` (the world
/// prints the messages).
pub(super) fn trace(now: u64, ev: &Ev) {
    match ev {
        Ev::WriteLand { from, bytes, .. } => {
            println!("{:>9} write by inst{from}: {bytes}", now / 1000)
        }
        Ev::Arrive(bytes) => println!("{:>9} bytes arrive: {bytes}", now / 1000),
        Ev::Crash { i } => println!("{:>9} crash inst{i}", now / 1000),
        Ev::Restart { i } => println!("{:>9} restart inst{i}", now / 1000),
        Ev::Stop { i } => println!("{:>9} stop inst{i}: drain", now / 1000),
        Ev::Leave { i, inc } => println!("{:>9} inst{i}.{inc} leaves", now / 1000),
        _ => {}
    }
}

impl Sim {
    /// Handles `ev`, touching the machines it moves.
    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::WriteLand {
                from,
                inc,
                token,
                bytes,
                late,
            } => {
                let ok = self.write_lands(bytes);
                if ok && late && self.world.incs[from] != inc {
                    self.ledger.out.late_after_crash += 1;
                }
                self.write_completes(from, inc, token, ok);
            }
            Ev::Arrive(bytes) => self.bytes_arrive(&bytes),
            Ev::Release { i, inc, token } => self.release(i, inc, token),
            Ev::Stage { i } => self.stage(i),
            Ev::Crash { i } => self.crash(i),
            Ev::Stop { i } => self.stop(i),
            Ev::Leave { i, inc } => self.leave(i, inc),
            Ev::Restart { i } => self.restart(i),
        }
    }

    /// Instance `i`, if incarnation `inc` of it runs.
    fn incarnation(&mut self, i: usize, inc: u32) -> Option<&mut Instance<'static>> {
        if self.world.incs[i] == inc {
            self.world.live(i)
        } else {
            None
        }
    }

    /// A write of `bytes` completes at its sender: whether it succeeded.
    /// Its bytes land now, or (on a notifying data plane) later, late, or
    /// never.
    fn write_lands(&mut self, bytes: Bytes) -> bool {
        let live = self.receiving(bytes.to, bytes.to_inc);
        if self.world.wire.fails() {
            false
        } else if self.setup.faults.notify {
            // The write completes at the sender; its bytes come later
            // (maybe much later, maybe never).
            if live {
                if let Some(delay) = self.world.wire.arrival(LANDING, LATE_ARRIVAL) {
                    self.world.schedule(delay, Ev::Arrive(bytes));
                }
            }
            true
        } else if live {
            self.land(&bytes);
            true
        } else {
            false
        }
    }

    /// The sender, incarnation `inc` of instance `from`, learns how its
    /// write went.
    fn write_completes(&mut self, from: usize, inc: u32, token: Token, ok: bool) {
        let now = self.world.now;
        if let Some(inst) = self.incarnation(from, inc) {
            let r = if ok { Ok(()) } else { Err("write failed") };
            let _ = inst.handle_completion(now, token, r);
            self.world.touch(from);
        }
    }

    /// On a notifying data plane, a write's bytes arrive at incarnation
    /// `to_inc` of instance `to`.
    fn bytes_arrive(&mut self, bytes: &Bytes) {
        let Bytes { to, tag, .. } = *bytes;
        // An instance that left is as good as gone: its pool is about to
        // be unmapped.
        if self.receiving(to, bytes.to_inc) {
            self.land(bytes);
            // Its data plane reports the arrival at once, whether or not
            // the transfer_ready came yet, naming it as libfabric's wide
            // notices do: by 40 bits of its tag.
            let now = self.world.now;
            if let Some(inst) = self.world.live(to) {
                inst.handle_landed(now, Landed::low_bits(tag.0, 40));
            }
            self.world.touch(to);
        }
    }

    /// Incarnation `inc` of instance `i` runs and has not left.
    fn receiving(&self, i: usize, inc: u32) -> bool {
        let w = &self.world;
        w.incs[i] == inc && w.up[i] && !w.insts[i].is_leaving()
    }

    /// Lands the `bytes` of a write for `id` at `offset` of instance `to`,
    /// first checking that they lie inside a slot reserved for its
    /// request: by the receiver (reserved, landing, delivered or
    /// quarantined), or (fast path) preallocated and assigned to it by the
    /// coordinator.
    fn land(&mut self, bytes: &Bytes) {
        let Bytes {
            ref id,
            to,
            offset,
            ref data,
            ..
        } = *bytes;
        let (seed, endpoint) = (self.seed, &self.setup.endpoints[to]);
        let node = &mut self.nodes[to];
        let w = &self.world;
        if !w.up[to] {
            return;
        }
        let inst = &w.insts[to];
        let prealloc = w
            .coord
            .peer_at(endpoint)
            .and_then(|peer| w.coord.prealloc_for(id, peer));
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
        let Some(inst) = self.incarnation(i, inc) else {
            return;
        };
        let rx = inst
            .received(token)
            .map(|rx| (rx.id.to_string(), rx.slot_offset));
        let Some((id, slot_offset)) = rx else {
            // Aborted and gone already, or a stale token.
            let _ = inst.release(token, None);
            self.world.touch(i);
            return;
        };
        let (seed, now) = (self.seed, self.now());
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
        let inst = &mut self.world.insts[i];
        match self.setup.forwarding {
            _ if role != 1 => inst.release(token, None).unwrap(),
            Forwarding::NewId => {
                inst.release(token, None).unwrap();
                let next_id = format!("{id}/d");
                ledger.staged_at.insert((next_id.clone(), role), now);
                stage_request(inst, node, ledger, &next_id, &next, now, None);
            }
            Forwarding::Forward | Forwarding::SglangDenoisers => {
                ledger.staged_at.insert((id.clone(), role), now);
                let sent = stage_request(inst, node, ledger, &id, &next, now, Some(token));
                if !sent {
                    // No room for the next leg: let go of the input all
                    // the same.
                    inst.release(token, None).unwrap();
                }
            }
        }
        self.world.touch(i);
    }

    /// Encoder `i`'s application stages a new request.
    fn stage(&mut self, i: usize) {
        let id = format!("s{}-r{}", self.seed, self.ledger.staged_count);
        let len = 1 + self.rng.below(12 * MIN_BLOCK) as usize;
        let data = pattern(&id, len);
        let now = self.now();
        if self.world.up[i] {
            self.ledger.staged_at.insert((id.clone(), 0), now);
            let inst = &mut self.world.insts[i];
            stage_request(
                inst,
                &mut self.nodes[i],
                &mut self.ledger,
                &id,
                &data,
                now,
                None,
            );
            self.world.touch(i);
        }
    }

    /// Instance `i` crashes (at most three times a run); it restarts a
    /// little later.
    fn crash(&mut self, i: usize) {
        // One that left is gone already (its restart is due).
        let up = self.world.up[i] && !self.world.insts[i].is_leaving();
        if self.crashes_left[i] > 0 && up {
            self.crashes_left[i] -= 1;
            // What it had staged dies with it.
            let node = &mut self.nodes[i];
            self.ledger.ended_at_sender.extend(node.staged.drain(..));
            self.world.crash(i);
            let back = 5 * MS + self.rng.below(50 * MS);
            self.world.schedule(back, Ev::Restart { i });
        }
    }

    /// A stop is asked of instance `i`: it drains, and leaves once its
    /// grace period is over.
    fn stop(&mut self, i: usize) {
        let (inc, now) = (self.world.incs[i], self.world.now);
        if let Some(inst) = self.world.live(i) {
            if !inst.is_draining() {
                inst.drain(now);
                self.world.touch(i);
                let grace = self.rng.below(60 * MS);
                self.world.schedule(grace, Ev::Leave { i, inc });
            }
        }
    }

    /// Incarnation `inc` of instance `i` leaves; a restart follows.
    fn leave(&mut self, i: usize, inc: u32) {
        let now = self.world.now;
        if let Some(inst) = self.incarnation(i, inc) {
            inst.leave(now, "stopped");
            // Its messages go out; then the process ends, and another
            // starts on the endpoint.
            self.world.touch(i);
            let back = 5 * MS + self.rng.below(50 * MS);
            self.world.schedule(back, Ev::Restart { i });
        }
    }

    /// Instance `i` starts again, as a new incarnation, once the one that
    /// left has all its writes in.
    fn restart(&mut self, i: usize) {
        let leaving = self.world.up[i].then(|| self.world.insts[i].has_left());
        if leaving == Some(false) {
            // Its writes are not all in yet: the process waits for them
            // before it ends.
            self.world.schedule(MS, Ev::Restart { i });
            return;
        }
        if leaving == Some(true) {
            // What is still addressed to the one that left is lost.
            self.world.incs[i] += 1;
        }
        let inc = self.world.incs[i];
        let (inst, session) = self.setup.instance(i, inc, self.now());
        self.world.restart(i, inst);
        let node = &mut self.nodes[i];
        node.session = session;
        node.pool.fill(0);
    }
}
