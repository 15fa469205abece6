//! The coordinator's output: messages encoded into the caller's buffer,
//! events, and when to be called back.

use super::*;

impl<'s> Coordinator<'s> {
    pub(super) fn send(&mut self, to: PeerId, msg: OutMsg) {
        let generation = self.peers.generation(to);
        let out = Outgoing {
            to,
            generation,
            msg,
        };
        if self.outbox.transmits.push(out).is_err() {
            self.stats.transmits_dropped += 1;
        }
    }

    pub(super) fn event(&mut self, e: CoordinatorEvent) {
        if self.outbox.events.push(e).is_err() {
            self.stats.events_dropped += 1;
        }
    }

    /// The next message to send, encoded into `buf`. A message that does
    /// not fit stays queued and its size is returned.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Result<Transmit, BufferTooSmall>> {
        loop {
            let out = *self.outbox.transmits.front()?;
            if out.generation != self.peers.generation(out.to) {
                // Its endpoint's place went to another peer since.
                self.outbox.transmits.pop();
                self.stats.transmits_dropped += 1;
                continue;
            }
            let mut sink = Sink::new(buf);
            let encoded = match out.msg {
                OutMsg::Ready { index, seq } => {
                    let Some(t) = self.transfers.records.get(index).filter(|t| t.seq == seq) else {
                        // The request ended before its READY went out.
                        self.outbox.transmits.pop();
                        continue;
                    };
                    let (manifest, scalars) = self.nested_of(index, t);
                    let session = t
                        .receiver
                        .and_then(|r| self.member(r))
                        .map(|m| m.session.as_json());
                    Msg::Ready(Ready {
                        request_id: t.id.as_json(),
                        manifest: Manifest::Raw(manifest),
                        slot_offset: t.slot_offset,
                        scalar_fields: scalars,
                        dest_session_id: session.unwrap_or_default(),
                        // sglang's receivers find their preallocated slot
                        // by it; ferry's by the offset.
                        prealloc_slot_id: t.prealloc,
                    })
                    .write(&mut sink, Default::default());
                    true
                }
                _ => false,
            };
            if !encoded {
                self.encode_simple(&out.msg, &mut sink);
            }
            return Some(match sink.finish() {
                Ok(len) => {
                    self.outbox.transmits.pop();
                    Ok(Transmit { to: out.to, len })
                }
                Err(e) => Err(e),
            });
        }
    }

    pub(super) fn encode_simple(&self, msg: &OutMsg, sink: &mut Sink<'_>) {
        let m = match msg {
            OutMsg::Ack {
                session,
                role,
                accepted,
                error,
            } => Msg::RegisterAck(RegisterAck {
                session_id: session.as_json(),
                role: JsonStr::plain(self.role_name(*role)),
                accepted: *accepted,
                error: error.map(JsonStr::plain),
            }),
            OutMsg::Alloc {
                id,
                data_size,
                source_role,
                session,
            } => Msg::Alloc(Alloc {
                request_id: id.as_json(),
                data_size: *data_size,
                source_role: JsonStr::plain(self.role_name(*source_role)),
                receiver_session_id: session.as_json(),
            }),
            OutMsg::Push {
                id,
                dest_session,
                dest_addr,
                transfer_size,
            } => Msg::Push(Push {
                request_id: id.as_json(),
                dest_session_id: dest_session.as_json(),
                dest_addr: *dest_addr,
                transfer_size: *transfer_size,
            }),
            OutMsg::Abort {
                id,
                reason,
                source_role,
            } => Msg::Abort(Abort {
                request_id: id.as_json(),
                reason: JsonStr::plain(reason),
                source_role: JsonStr::plain(self.role_name(*source_role)),
            }),
            OutMsg::Drained { session } => Msg::Deregister(Deregister {
                session_id: session.as_json(),
                draining: false,
                reason: JsonStr::plain("drained"),
            }),
            OutMsg::Ready { .. } => return,
        };
        m.write(sink, Default::default());
    }

    /// The name of pipeline role `role` ("" if there is none).
    pub(super) fn role_name(&self, role: usize) -> &str {
        self.pipeline().get(role).map_or("", Text::as_str)
    }

    /// The pipeline's roles, in hand-off order.
    pub(super) fn pipeline(&self) -> &[Text<ROLE_LEN>] {
        &self.roles[..self.role_count]
    }

    /// The pipeline role the application named `role`.
    pub(super) fn role_named(&self, role: &str) -> Result<usize, ConfigError> {
        self.pipeline()
            .iter()
            .position(|r| r.as_str() == role)
            .ok_or(ConfigError::UnknownRole)
    }

    pub(super) fn nested_of(&self, index: usize, t: &Transfer) -> (RawJson<'_>, RawJson<'_>) {
        self.transfers.nested_of(index, t)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CoordinatorEvent> {
        self.outbox.events.pop()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called next:
    /// the tops of the deadline heaps.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let transfers = self.transfers.records.next_due().map(|(at, _)| at);
        let parked = self.remains.parked.next_due().map(|(at, _)| at);
        transfers.into_iter().chain(parked).min()
    }
}
