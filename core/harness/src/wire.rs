//! What becomes of each control message and each write between the
//! world's machines: the [`Wire`] decides, the world applies.

use tensorferry_core::fault_plan::FaultPlan;
use tensorferry_core::handshake::instance::Write;
use tensorferry_core::wire::{decode, MsgType};

/// A millisecond of the virtual clock, in its nanoseconds.
pub const MS: u64 = 1_000_000;

/// The fate of control messages and writes, decided one at a time.
pub trait Wire {
    /// The copies of the message `bytes` that arrive, each after its delay
    /// in nanoseconds (zero: at once, before anything else moves); none:
    /// it is lost.
    fn carry(&mut self, bytes: &[u8]) -> [Option<u64>; 2];

    /// What becomes of the write `w`, posted now.
    fn write(&mut self, w: &Write) -> WriteFate;
}

/// What becomes of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFate {
    /// It completes at once, with this result.
    Now(Result<(), &'static str>),
    /// It stays pending, for the driver to complete (`World::pending`).
    Held,
    /// It goes over the driver's data plane (`World::posted`).
    Posted(Posting),
}

/// A write on a simulated data plane: when it lands, and what goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posting {
    /// Nanoseconds after posting that it lands and completes.
    pub after: u64,
    /// It took long ([`FaultPlan::delay_write`]).
    pub late: bool,
    /// Its sender crashes just after posting it
    /// ([`FaultPlan::crash_after_write`]).
    pub crash_sender: bool,
}

/// Every message once, in order, at once; every write completes at once.
/// A test may drop the messages of some types, or hold writes.
#[derive(Clone, Debug)]
pub struct Lossless {
    /// Drop messages of these types, either way.
    pub drop: Vec<MsgType>,
    /// Complete writes at once (with this result), or (`None`) hold them.
    pub writes: Option<Result<(), &'static str>>,
}

impl Default for Lossless {
    fn default() -> Self {
        Self {
            drop: Vec::new(),
            writes: Some(Ok(())),
        }
    }
}

impl Wire for Lossless {
    fn carry(&mut self, bytes: &[u8]) -> [Option<u64>; 2] {
        let dropped =
            !self.drop.is_empty() && decode(bytes).is_ok_and(|m| self.drop.contains(&m.msg_type()));
        [(!dropped).then_some(0), None]
    }

    fn write(&mut self, _: &Write) -> WriteFate {
        self.writes.map_or(WriteFate::Held, WriteFate::Now)
    }
}

/// A small deterministic generator (xorshift64*): a run replays by its
/// seed.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (below 1 where `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

/// The core's [`FaultPlan`] on the virtual clock, drawn from its seed.
#[derive(Clone, Debug)]
pub struct Faulty {
    /// What goes wrong, and how often.
    pub plan: FaultPlan,
    /// The draws, from `plan.seed`.
    pub rng: Rng,
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Faulty {
    /// The plan's faults, drawn from its seed.
    pub fn new(plan: FaultPlan) -> Self {
        Self {
            rng: Rng(plan.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            plan,
        }
    }

    /// Whether a write fails as it lands ([`FaultPlan::fail_write`]).
    pub fn fails(&mut self) -> bool {
        self.rng.chance(self.plan.fail_write)
    }

    /// On a data plane that reports arrivals: how long after its
    /// completion a write's bytes arrive (below a millisecond; late, from
    /// half of `landing` up to `latest`, by [`FaultPlan::late_notice`]),
    /// or (by [`FaultPlan::lose_notice`]) that they never do.
    pub fn arrival(&mut self, landing: u64, latest: u64) -> Option<u64> {
        if self.rng.chance(self.plan.lose_notice) {
            return None;
        }
        Some(if self.rng.chance(self.plan.late_notice) {
            landing / 2 + self.rng.below(latest - landing / 2)
        } else {
            self.rng.below(MS)
        })
    }
}

impl Wire for Faulty {
    /// Maybe lost, maybe twice, each copy in transit up to the plan's
    /// `jitter` (so reordered), and some held back `delay` more.
    fn carry(&mut self, _: &[u8]) -> [Option<u64>; 2] {
        if self.rng.chance(self.plan.drop) {
            return [None, None];
        }
        let twice = self.rng.chance(self.plan.duplicate);
        let jitter = ns(self.plan.jitter);
        let delay = ns(self.plan.delay);
        let mut one = || {
            let held = if self.rng.chance(self.plan.delay_message) {
                delay
            } else {
                0
            };
            1 + self.rng.below(jitter) + held
        };
        let first = one();
        [Some(first), twice.then(one)]
    }

    /// Lands within 3 ms, or (by the plan's `delay_write`) late, from half
    /// its `write_lifetime` to all of it; its sender may crash just after.
    fn write(&mut self, _: &Write) -> WriteFate {
        let late = self.rng.chance(self.plan.delay_write);
        let after = if late {
            let life = ns(self.plan.write_lifetime);
            life / 2 + self.rng.below(life / 2)
        } else {
            1 + self.rng.below(3 * MS)
        };
        let crash_sender = self.rng.chance(self.plan.crash_after_write);
        WriteFate::Posted(Posting {
            after,
            late,
            crash_sender,
        })
    }
}

/// The fuzzer's bytes choose the fates, one byte each; once they run out,
/// messages arrive at once and writes are held.
#[derive(Clone, Debug, Default)]
pub struct Bytes {
    data: Vec<u8>,
    at: usize,
}

impl Bytes {
    /// Fates read from `data`.
    pub fn new(data: Vec<u8>) -> Self {
        Self { data, at: 0 }
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.data.get(self.at).copied();
        self.at += 1;
        b
    }
}

impl Wire for Bytes {
    /// Lost, twice, delayed (1 to 32 ms, so overtaken) or at once.
    fn carry(&mut self, _: &[u8]) -> [Option<u64>; 2] {
        let Some(b) = self.next() else {
            return [Some(0), None];
        };
        let later = (u64::from(b >> 3) + 1) * MS;
        match b & 7 {
            0 => [None, None],
            1 => [Some(0), Some(0)],
            2 => [Some(0), Some(later)],
            3 | 4 => [Some(later), None],
            _ => [Some(0), None],
        }
    }

    /// Failed or done at once, or held for the fuzzer's `Complete`.
    fn write(&mut self, _: &Write) -> WriteFate {
        match self.next().map(|b| b & 3) {
            Some(0) => WriteFate::Now(Err("failed")),
            Some(1) => WriteFate::Now(Ok(())),
            _ => WriteFate::Held,
        }
    }
}
