//! The progress thread: receives control messages, posts the writes the
//! state machine asks for, reaps their completions and reports arrivals.

use super::*;

/// The progress thread's own state.
pub(super) struct Progress<T: Transport, R> {
    pub(super) shared: Arc<Shared>,
    pub(super) transport: T,
    pub(super) region: Region,
    pub(super) rx: R,
    pub(super) buf: Vec<u8>,
    pub(super) writes: Vec<Write>,
    /// Writes posted and not yet completed.
    pub(super) in_flight: usize,
    /// Finished writes, with the data plane's own text for a failure.
    pub(super) done: Vec<(Token, Result<(), Reason>)>,
    /// The writes the data plane reported landed this turn, reused.
    pub(super) arrived: Vec<Landed>,
    /// The transport's wake descriptor, if it has one.
    pub(super) wake: Option<i32>,
}

impl<T, R> Progress<T, R>
where
    T: Transport,
    R: ControlRecv,
{
    pub(super) fn run(&mut self) {
        let shared = Arc::clone(&self.shared);
        while !shared.stop.load(Ordering::Relaxed) {
            let (wait, wake, woke) = {
                let mut st = shared.lock();
                let now = shared.clock.now();
                let woke = shared.drive(&mut st, now);
                let next = st.machine.poll_timeout();
                // The data plane's descriptor is waited on only while a
                // write or a landing is awaited: a channel that cannot
                // watch it then returns within `WAKE_POLL`, and an idle
                // node waits for messages alone. Without a descriptor,
                // completions and arrivals are polled for.
                let quiet = self.in_flight == 0 && st.machine.awaiting_landing() == 0;
                let wake = if quiet { None } else { self.wake };
                let cap = if wake.is_some() || quiet {
                    MAX_WAIT
                } else {
                    POLL_WRITES
                };
                (shared.clock.until(next, cap), wake, woke)
            };
            if woke {
                shared.wake();
            }
            shared.send_queued();
            self.receive(wait, wake);
            self.post_writes();
            // Completions first: reaping clears the wake descriptor, and
            // notices that come after the landing check signal it anew.
            self.reap();
            self.land();
        }
    }

    fn receive(&mut self, wait: Duration, wake: Option<i32>) {
        let shared = &*self.shared;
        let m = &shared.probe.metrics;
        let got = self.rx.recv(&mut self.buf, wait, wake);
        match got {
            Ok(Some(ChannelEvent::Message(msg))) => {
                let mut st = shared.lock();
                let now = shared.clock.now();
                let r = st.machine.handle_incoming(now, &msg);
                match r {
                    Err(InstanceUnhandled::Foreign) => {
                        Metrics::add(&m.non_transfer, 1);
                        if st.frames.len() >= FRAMES {
                            st.frames.pop_front();
                        }
                        st.frames.push_back(Frame {
                            magic: msg.magic.to_vec(),
                            payload: msg.payload.to_vec(),
                        });
                        drop(st);
                        shared.wake();
                        return;
                    }
                    Err(InstanceUnhandled::Malformed(e)) => {
                        Metrics::add(&m.messages_in, 1);
                        m.malformed(msg.from, msg.via, &e);
                        return;
                    }
                    Err(InstanceUnhandled::Ignored(why)) => {
                        Metrics::add(&m.messages_in, 1);
                        Metrics::add(&m.ignored, 1);
                        debug!(?why, "message ignored");
                    }
                    Ok(()) => Metrics::add(&m.messages_in, 1),
                }
                while let Some(w) = st.machine.poll_action() {
                    self.writes.push(w);
                }
                shared.drive_and_send(st, now);
            }
            Ok(Some(ChannelEvent::Gone { from })) => {
                let mut st = shared.lock();
                let now = shared.clock.now();
                if shared.peer_gone(&mut st, now, from) {
                    warn!(coordinator = %from, "coordinator gone");
                    Metrics::add(&m.peers_lost, 1);
                    shared.drive_and_send(st, now);
                }
            }
            Ok(None) => {}
            Err(e) => {
                Metrics::add(&m.bad_frames, 1);
                warn!(error = %e, "control receive");
            }
        }
    }

    /// Hands the state machine the writes the data plane reports landed
    /// (it decides what waits for them, and for how long).
    fn land(&mut self) {
        self.arrived.clear();
        while let Some(landed) = self.transport.poll_landed() {
            self.arrived.push(landed);
        }
        if self.arrived.is_empty() {
            return;
        }
        let shared = &*self.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        let mut handed = false;
        for &landed in &self.arrived {
            handed |= st.machine.handle_landed(now, landed);
        }
        if handed {
            shared.drive_and_send(st, now);
        }
    }

    fn post_writes(&mut self) {
        let m = &self.shared.probe.metrics;
        for w in self.writes.drain(..) {
            let _span = debug_span!("write", id = %w.id, len = w.len).entered();
            Metrics::add(&m.writes, 1);
            match self.transport.post_write(&WriteOp {
                region: self.region,
                local_offset: w.local_offset,
                len: w.len,
                dest_session: w.dest_session.as_str(),
                dest_addr: w.dest_addr,
                tag: w.tag,
                cookie: w.token.cookie(),
            }) {
                Ok(()) => self.in_flight += 1,
                Err(e) => {
                    let kind = T::fault_kind(&e);
                    self.shared.probe.write_failed(kind);
                    warn!(id = %w.id, dest = %w.dest_session, error = %e, "write not posted");
                    self.done.push((w.token, Err(reason(kind, &e))));
                }
            }
        }
    }

    fn reap(&mut self) {
        let m = &self.shared.probe.metrics;
        while let Some(c) = self.transport.poll_completion() {
            self.in_flight = self.in_flight.saturating_sub(1);
            let token = Token::from_cookie(c.cookie);
            match c.result {
                Ok(()) => self.done.push((token, Ok(()))),
                Err(e) => {
                    let kind = T::fault_kind(&e);
                    self.shared.probe.write_failed(kind);
                    warn!(error = %e, "write failed");
                    self.done.push((token, Err(reason(kind, &e))));
                }
            }
        }
        if self.done.is_empty() {
            return;
        }
        let shared = &*self.shared;
        let mut st = shared.lock();
        let now = shared.clock.now();
        for (token, result) in self.done.drain(..) {
            let ok = result.is_ok();
            let result = result.as_ref().map(|_| ()).map_err(|r| r.as_str());
            if let Ok(len) = st.machine.handle_completion(now, token, result) {
                if ok {
                    Metrics::add(&m.bytes_written, len);
                }
            }
        }
        shared.drive_and_send(st, now);
    }
}

/// A failed write's reason for the coordinator: its kind, then the data
/// plane's own text (which names the peer, the call and the errno), cut to
/// fit, written without allocating.
fn reason(kind: FaultKind, e: &impl std::fmt::Display) -> Reason {
    use std::fmt::Write as _;
    let mut r = Reason::EMPTY;
    let _ = write!(r, "{kind}: {e}");
    r
}
