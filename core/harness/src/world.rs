//! The world: a coordinator and instances (instance `i` is peer `i + 1`
//! where a driver names peers by number), a virtual clock with every
//! machine's timer and the messages in transit, and a [`Wire`] that decides
//! each message's and write's fate. Events of the driver's own (`E`) share
//! the clock.

use tensorferry_core::handshake::coordinator::{
    Coordinator, CoordinatorEvent, FailReason, Unhandled,
};
use tensorferry_core::handshake::instance::{
    Instance, InstanceEvent, InstanceUnhandled, Token, Write,
};
use tensorferry_core::handshake::{Ignored, Instant, PeerId};
use tensorferry_core::wire::{decode, MsgType};

use crate::machines as m;
use crate::queue::Queue;
use crate::wire::{Posting, Wire, WriteFate, MS};

enum Ev<E> {
    ToCoord { from: usize, bytes: Vec<u8> },
    ToInst { to: usize, inc: u32, bytes: Vec<u8> },
    Own(E),
}

/// A coordinator and instances joined by `W`, on a virtual clock, with
/// the driver's events `E` on the same clock. What the machines emit is
/// kept in its public fields for the driver to read (and drain).
pub struct World<'s, W, E = ()> {
    /// The virtual clock.
    pub now: Instant,
    /// The coordinator.
    pub coord: Coordinator<'s>,
    /// The instances, by index (a crashed one stays, [`World::up`] false,
    /// until it restarts).
    pub insts: Vec<Instance<'s>>,
    /// What becomes of each message and write.
    pub wire: W,
    /// Whether each instance runs.
    pub up: Vec<bool>,
    /// Each instance's incarnation: messages sent to an earlier one are
    /// lost.
    pub incs: Vec<u32>,
    /// Assert what a lossless, well-behaved world guarantees: the
    /// coordinator names instance `i` peer `i + 1`, content names only the
    /// sender, every message is handled, a completed write has its length.
    pub strict: bool,
    /// Keep every message's type and text (`log`, `from_*`).
    pub record: bool,
    /// Judge every message to the coordinator by its content alone
    /// (`Coordinator::sender_of`), as a ZeroMQ coordinator does; a strict
    /// world asserts the verdict.
    pub judge: bool,
    /// Route a message to a peer the coordinator knows no endpoint of by
    /// the peer's number (a driver that named peers itself); otherwise it
    /// is counted `unaddressed`.
    pub by_number: bool,
    /// Keep every message that reached the coordinator (`arrived`).
    pub keep_arrivals: bool,
    /// Print every message as it arrives.
    pub trace: bool,
    /// Where the instances' messages arrive at the coordinator.
    pub via: String,
    /// Writes the wire held for the driver to complete.
    pub pending: Vec<(usize, Write)>,
    /// Writes on the driver's data plane: sender, its incarnation, the
    /// write, and what the wire made of it.
    pub posted: Vec<(usize, u32, Write, Posting)>,
    /// Every message that went over the wire: (to coordinator?, type).
    pub log: Vec<(bool, MsgType)>,
    /// The text of every message the instances sent.
    pub from_instances: Vec<String>,
    /// The text of every message the coordinator sent.
    pub from_coordinator: Vec<String>,
    /// Messages that reached the coordinator: sender, bytes.
    pub arrived: Vec<(usize, Vec<u8>)>,
    /// The coordinator's events, in order.
    pub coord_events: Vec<CoordinatorEvent>,
    /// The instances' events, in order, by instance.
    pub inst_events: Vec<(usize, InstanceEvent)>,
    /// Why each message a machine ignored was ignored.
    pub ignored: Vec<Ignored>,
    /// Messages to the coordinator whose sender its content named.
    pub judged: u64,
    /// Messages of the coordinator to a peer no instance is.
    pub unaddressed: u64,
    queue: Queue<Ev<E>>,
    /// Each machine's next timeout (the coordinator's first), as of its
    /// last drain.
    deadlines: Vec<Option<u64>>,
    touched_coord: bool,
    touched: Vec<bool>,
    buf: Vec<u8>,
}

impl<'s, W: Wire + Default, E> World<'s, W, E> {
    /// `coord` and `insts` over `W`'s default, their first output
    /// carried.
    pub fn new(coord: Coordinator<'s>, insts: Vec<Instance<'s>>) -> Self {
        Self::with_wire(coord, insts, W::default(), true)
    }
}

impl<'s, W: Wire, E> World<'s, W, E> {
    /// `coord` and `insts` over `wire`, `strict` or not; their first
    /// output carried.
    pub fn with_wire(
        coord: Coordinator<'s>,
        insts: Vec<Instance<'s>>,
        wire: W,
        strict: bool,
    ) -> Self {
        let n = insts.len();
        let mut w = World {
            now: Instant(0),
            coord,
            insts,
            wire,
            up: vec![true; n],
            incs: vec![0; n],
            strict,
            record: strict,
            judge: true,
            by_number: true,
            keep_arrivals: false,
            trace: false,
            via: "tcp://coordinator:1".to_owned(),
            pending: Vec::new(),
            posted: Vec::new(),
            log: Vec::new(),
            from_instances: Vec::new(),
            from_coordinator: Vec::new(),
            arrived: Vec::new(),
            coord_events: Vec::new(),
            inst_events: Vec::new(),
            ignored: Vec::new(),
            judged: 0,
            unaddressed: 0,
            queue: Queue::default(),
            deadlines: vec![None; n + 1],
            touched_coord: false,
            touched: vec![false; n],
            buf: vec![0u8; 64 * 1024],
        };
        w.pump();
        w
    }

    /// Makes room for instances a driver pushed onto `insts`.
    fn grow(&mut self) {
        let n = self.insts.len();
        if self.up.len() < n {
            self.up.resize(n, true);
            self.incs.resize(n, 0);
            self.touched.resize(n, true);
            self.deadlines.resize(n + 1, None);
        }
    }

    /// The coordinator has something new to say (drained next).
    pub fn touch_coordinator(&mut self) {
        self.touched_coord = true;
    }

    /// Instance `i` has something new to say (drained next).
    pub fn touch(&mut self, i: usize) {
        self.touched[i] = true;
    }

    /// Instance `i` stops dead: what is on its way to it is lost.
    pub fn crash(&mut self, i: usize) {
        self.up[i] = false;
        self.incs[i] += 1;
        self.deadlines[i + 1] = None;
    }

    /// `inst` runs in instance `i`'s place.
    pub fn restart(&mut self, i: usize, inst: Instance<'s>) {
        self.insts[i] = inst;
        self.up[i] = true;
        self.touched[i] = true;
    }

    /// Instance `i`, if it runs.
    pub fn live(&mut self, i: usize) -> Option<&mut Instance<'s>> {
        self.up[i].then(|| &mut self.insts[i])
    }

    /// `e` happens `after` nanoseconds from now.
    pub fn schedule(&mut self, after: u64, e: E) {
        self.queue.push(self.now.0 + after, Ev::Own(e));
    }

    /// `e` happens at `at` nanoseconds of the clock (now, if that is
    /// past).
    pub fn schedule_at(&mut self, at: u64, e: E) {
        self.queue.push(at.max(self.now.0), Ev::Own(e));
    }

    /// Drains every machine, then what that carried at once.
    pub fn pump(&mut self) {
        self.grow();
        self.touched_coord = true;
        self.touched.fill(true);
        self.drain();
    }

    /// Drains the machines touched, then those the messages carried at
    /// once reached, until none is: messages go on the wire, writes to
    /// their fate, events into the lists; timers are noted.
    pub fn drain(&mut self) {
        self.grow();
        loop {
            let mut moved = false;
            if std::mem::take(&mut self.touched_coord) {
                moved = true;
                self.drain_coordinator();
            }
            for i in 0..self.insts.len() {
                if std::mem::take(&mut self.touched[i]) && self.up[i] {
                    moved = true;
                    self.drain_instance(i);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn drain_coordinator(&mut self) {
        for (to, bytes) in m::coordinator_outbox(&mut self.coord, &mut self.buf) {
            let ty = decode(&bytes).expect("the coordinator sends what decodes");
            if self.record {
                self.log.push((false, ty.msg_type()));
                let text = String::from_utf8(bytes.clone()).expect("messages are UTF-8");
                self.from_coordinator.push(text);
            }
            // Where the coordinator named the peer, by the endpoint it
            // named it by; a peer the driver named itself, by its number.
            let to = match self.coord.endpoint_of(to) {
                Some(_) => m::addressee(
                    &self.coord,
                    to,
                    self.insts.iter().map(Instance::work_endpoint),
                ),
                None if self.by_number => (to.0 as usize)
                    .checked_sub(1)
                    .filter(|&i| i < self.insts.len()),
                None => None,
            };
            let Some(to) = to else {
                self.unaddressed += 1;
                continue;
            };
            let inc = self.incs[to];
            for delay in self.wire.carry(&bytes).into_iter().flatten() {
                if delay == 0 {
                    self.deliver_to_instance(to, inc, &bytes);
                } else {
                    let bytes = bytes.clone();
                    self.queue
                        .push(self.now.0 + delay, Ev::ToInst { to, inc, bytes });
                }
            }
        }
        self.coord_events
            .extend(m::coordinator_events(&mut self.coord));
        self.deadlines[0] = self.coord.poll_timeout().map(|t| t.0);
    }

    fn drain_instance(&mut self, i: usize) {
        let inc = self.incs[i];
        for bytes in m::instance_outbox(&mut self.insts[i], &mut self.buf) {
            let ty = decode(&bytes).expect("instances send what decodes");
            if self.record {
                self.log.push((true, ty.msg_type()));
                let text = String::from_utf8(bytes.clone()).expect("messages are UTF-8");
                self.from_instances.push(text);
            }
            for delay in self.wire.carry(&bytes).into_iter().flatten() {
                if delay == 0 {
                    self.deliver_to_coordinator(i, &bytes);
                } else {
                    let bytes = bytes.clone();
                    self.queue
                        .push(self.now.0 + delay, Ev::ToCoord { from: i, bytes });
                }
            }
        }
        for w in m::writes(&mut self.insts[i]) {
            match self.wire.write(&w) {
                WriteFate::Now(r) => {
                    let len = self.insts[i].handle_completion(self.now, w.token, r);
                    if self.strict {
                        assert_eq!(len.expect("a write it posted"), w.len);
                    }
                    self.touched[i] = true;
                }
                WriteFate::Held => self.pending.push((i, w)),
                WriteFate::Posted(p) => self.posted.push((i, inc, w, p)),
            }
        }
        let events = m::instance_events(&mut self.insts[i]);
        self.inst_events.extend(events.into_iter().map(|e| (i, e)));
        self.deadlines[i + 1] = self.insts[i].poll_timeout().map(|t| t.0);
    }

    /// A message of instance `from` reaches the coordinator, as a channel
    /// that names senders delivers it (by the instance's endpoint).
    /// Messages of a dead incarnation still in flight arrive like any
    /// other, as they would on a real network.
    fn deliver_to_coordinator(&mut self, from: usize, bytes: &[u8]) {
        let me = PeerId(from as u32 + 1);
        if self.judge {
            // Judged by content alone, the sender is the one that sent
            // it (or unknown): what a ZeroMQ coordinator relies on.
            let msg = decode(bytes).expect("instances send what decodes");
            let judged = self.coord.sender_of(&msg, self.coord.role_of(me));
            if let (Some(p), true) = (judged, self.strict) {
                assert_eq!(p, me, "{msg:?}");
            }
            self.judged += u64::from(judged.is_some());
        }
        if self.trace {
            let text = String::from_utf8_lossy(bytes);
            println!("{:>9} inst{from} -> coord: {text}", self.now.0 / 1000);
        }
        let endpoint = self.insts[from].work_endpoint();
        let r = m::deliver(&mut self.coord, self.now, endpoint, &self.via, bytes);
        match r {
            Ok(p) if self.strict => assert_eq!(p, me, "{}", String::from_utf8_lossy(bytes)),
            Ok(_) => {}
            Err(Unhandled::Ignored { peer, why }) => {
                if self.strict {
                    assert_eq!(peer, me, "{}", String::from_utf8_lossy(bytes));
                }
                self.ignored.push(why);
            }
            Err(e) if self.strict => panic!("{}: {e}", String::from_utf8_lossy(bytes)),
            Err(_) => {}
        }
        if self.keep_arrivals {
            self.arrived.push((from, bytes.to_vec()));
        }
        self.touched_coord = true;
    }

    /// A message of the coordinator reaches incarnation `inc` of instance
    /// `to`, if that one still runs, as its channel delivers it.
    fn deliver_to_instance(&mut self, to: usize, inc: u32, bytes: &[u8]) {
        if self.incs[to] != inc || !self.up[to] {
            return;
        }
        if self.trace {
            let text = String::from_utf8_lossy(bytes);
            println!("{:>9} coord -> inst{to}.{inc}: {text}", self.now.0 / 1000);
        }
        match m::deliver_to_instance(&mut self.insts[to], self.now, bytes) {
            Ok(()) => {}
            Err(InstanceUnhandled::Ignored(why)) => self.ignored.push(why),
            // The coordinator sends only what decodes.
            Err(e) => panic!("{}: {e}", String::from_utf8_lossy(bytes)),
        }
        self.touched[to] = true;
    }

    /// When the next thing happens: a timer or something in transit.
    pub fn next_at(&self) -> Option<u64> {
        let timer = self.deadlines.iter().flatten().min().copied();
        match (timer, self.queue.next_at()) {
            (Some(t), Some(q)) => Some(t.min(q)),
            (t, q) => t.or(q),
        }
    }

    /// The next thing happens (the clock moves to it): a message arrives,
    /// timers fire (every machine's that is due), or the driver's event
    /// comes, and is returned for the driver to handle. `None`: nothing
    /// is left to happen. Call [`World::drain`] after.
    pub fn step(&mut self) -> Option<Option<E>> {
        self.grow();
        let timer = self.deadlines.iter().flatten().min().copied();
        let queued = self.queue.next_at();
        if let Some(t) = timer.filter(|t| queued.is_none_or(|q| *t < q)) {
            self.now = Instant(t.max(self.now.0));
            self.fire(false);
            return Some(None);
        }
        let (at, ev) = self.queue.pop()?;
        self.now = Instant(at.max(self.now.0));
        match ev {
            Ev::ToCoord { from, bytes } => self.deliver_to_coordinator(from, &bytes),
            Ev::ToInst { to, inc, bytes } => self.deliver_to_instance(to, inc, &bytes),
            Ev::Own(e) => return Some(Some(e)),
        }
        Some(None)
    }

    /// The timers due now fire (`all`: every machine's, due or not, as an
    /// event loop that overslept calls them).
    fn fire(&mut self, all: bool) {
        let now = self.now;
        let due = |d: Option<u64>| all || d.is_some_and(|d| d <= now.0);
        if due(self.deadlines[0]) {
            self.deadlines[0] = None;
            self.coord.handle_timeout(now);
            self.touched_coord = true;
        }
        for i in 0..self.insts.len() {
            if self.up[i] && due(self.deadlines[i + 1]) {
                self.deadlines[i + 1] = None;
                self.insts[i].handle_timeout(now);
                self.touched[i] = true;
            }
        }
    }

    /// Moves the clock on by `ms`, everything due on the way happening
    /// (the driver's own events are dropped: for worlds without them).
    pub fn advance(&mut self, ms: u64) {
        let end = self.now.0 + ms * MS;
        self.pump();
        for _ in 0..100_000 {
            if self.next_at().is_none_or(|t| t > end) {
                self.now = Instant(end);
                return;
            }
            self.step();
            self.drain();
        }
        panic!(
            "timers do not settle: coordinator {:?}, instances {:?}",
            self.coord.poll_timeout(),
            self.insts
                .iter()
                .map(Instance::poll_timeout)
                .collect::<Vec<_>>()
        );
    }

    /// Jumps the clock to `to` as an event loop that overslept: what is
    /// in transit until then arrives, then every machine's timer fires
    /// once, late.
    pub fn oversleep(&mut self, to: Instant) {
        while self.queue.next_at().is_some_and(|t| t <= to.0) {
            let Some((at, ev)) = self.queue.pop() else {
                break;
            };
            self.now = Instant(at.max(self.now.0));
            match ev {
                Ev::ToCoord { from, bytes } => self.deliver_to_coordinator(from, &bytes),
                Ev::ToInst { to, inc, bytes } => self.deliver_to_instance(to, inc, &bytes),
                Ev::Own(_) => {}
            }
            self.drain();
        }
        self.now = Instant(to.0.max(self.now.0));
        self.fire(true);
        self.drain();
    }

    // ---- what happened --------------------------------------------------------

    /// Messages of type `ty` that went over the wire, either way.
    pub fn sent(&self, ty: MsgType) -> usize {
        self.log.iter().filter(|(_, t)| *t == ty).count()
    }

    /// The deliveries instance `i` received.
    pub fn received(&self, i: usize) -> Vec<Token> {
        self.inst_events
            .iter()
            .filter_map(|(j, e)| match e {
                InstanceEvent::Received(t) if *j == i => Some(*t),
                _ => None,
            })
            .collect()
    }

    /// Why each failed transfer failed, at the coordinator.
    pub fn failed(&self) -> Vec<FailReason> {
        self.coord_events
            .iter()
            .filter_map(|e| match e {
                CoordinatorEvent::Failed { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    /// Transfers delivered, at the coordinator.
    pub fn delivered(&self) -> usize {
        self.coord_events
            .iter()
            .filter(|e| matches!(e, CoordinatorEvent::Delivered { .. }))
            .count()
    }

    /// Nothing held anywhere: the coordinator drained, and every running
    /// instance holds only its `prealloc` preallocated slots.
    pub fn assert_drained(&self, prealloc: u64, ctx: &str) {
        m::assert_coordinator_drained(&self.coord, ctx);
        for (i, inst) in self.insts.iter().enumerate() {
            if self.up[i] {
                m::assert_instance_drained(inst, prealloc, &format!("{ctx}: instance {i}"));
            }
        }
    }
}
