//! The instance's output: writes to post, events, and messages encoded into
//! the caller's buffer.

use super::*;
use crate::wire::Style;

impl<'s> Instance<'s> {
    /// The next write to post.
    pub fn poll_action(&mut self) -> Option<Write> {
        self.outbox.actions.pop()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<InstanceEvent> {
        self.outbox.events.pop()
    }

    /// The next message for the coordinator, encoded into `buf`; one that
    /// does not fit stays queued and its size is returned.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Result<usize, BufferTooSmall>> {
        let dialect = self.config.head.dialect();
        // A registration offers every preallocated slot as free: it waits
        // until the application has let go of those it still holds (after
        // `reregister`), or a new coordinator would write into them.
        if self.standing.register_due && self.prealloc_in_use() == 0 {
            let mut sink = Sink::new(buf);
            Msg::Register(Register {
                role: self.role.as_json(),
                session_id: self.session.as_json(),
                pool_ptr: self.pool_ptr,
                pool_size: self.pool_size,
                work_endpoint: self.endpoint.as_json(),
                preallocated_slots: SlotList::Slots(&self.slots.prealloc),
                write_lifetime_ms: self.write_lifetime_ms,
            })
            .write_dialect(&mut sink, Style::Verbatim, dialect);
            let r = sink.finish();
            if r.is_ok() {
                self.standing.register_due = false;
                self.standing.register_sent = true;
                self.standing.acks_owed = self.standing.acks_owed.saturating_add(1);
                if self.config.head == Head::Sglang && !self.standing.registered {
                    // That head never answers: sent is as far as it goes.
                    self.standing.registered = true;
                    self.event(InstanceEvent::Registered);
                }
            }
            return Some(r);
        }
        if let Some(reason) = self.standing.farewell {
            // The leaving of an instance whose registration was not
            // answered: the coordinator may know it all the same.
            let mut sink = Sink::new(buf);
            Msg::Deregister(Deregister {
                session_id: self.session.as_json(),
                draining: false,
                reason: JsonStr::plain(reason.as_str()),
            })
            .write_dialect(&mut sink, Style::Verbatim, dialect);
            let r = sink.finish();
            if r.is_ok() {
                self.standing.farewell = None;
            }
            return Some(r);
        }
        if !self.standing.registered {
            // Nothing is announced to a coordinator that does not know us.
            return None;
        }
        loop {
            let Outgoing(m) = *self.outbox.transmits.front()?;
            let mut sink = Sink::new(buf);
            match m {
                OutMsg::Staged { index, seq } | OutMsg::Forward { index, seq } => {
                    let Some(StagedView {
                        r,
                        slot_offset,
                        data_size,
                        manifest,
                        scalar_fields,
                    }) = self.staged_view(index, seq)
                    else {
                        // It ended before its announcement went out.
                        self.outbox.transmits.pop();
                        continue;
                    };
                    let staged = Staged {
                        request_id: r.id.as_json(),
                        data_size,
                        manifest: Manifest::Raw(manifest),
                        session_id: self.session.as_json(),
                        pool_ptr: self.pool_ptr,
                        slot_offset,
                        scalar_fields,
                    };
                    match m {
                        OutMsg::Forward { .. } => Msg::Done(Done::forward(staged)),
                        _ => Msg::Staged(staged),
                    }
                    .write_dialect(&mut sink, Style::Verbatim, dialect)
                }
                OutMsg::Allocated {
                    id,
                    slot_offset,
                    slot_size,
                } => Msg::Allocated(Allocated {
                    request_id: id.as_json(),
                    session_id: self.session.as_json(),
                    pool_ptr: self.pool_ptr,
                    slot_offset,
                    slot_size,
                })
                .write_dialect(&mut sink, Style::Verbatim, dialect),
                OutMsg::Reject {
                    id,
                    retryable,
                    reason,
                } => Msg::AllocReject(AllocReject {
                    request_id: id.as_json(),
                    session_id: self.session.as_json(),
                    retryable,
                    reason: JsonStr::plain(reason),
                })
                .write_dialect(&mut sink, Style::Verbatim, dialect),
                OutMsg::Pushed { id, error } => Msg::Pushed(Pushed {
                    request_id: id.as_json(),
                    success: error.is_none(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                })
                .write_dialect(&mut sink, Style::Verbatim, dialect),
                OutMsg::Done { id, error } => Msg::Done(Done {
                    request_id: id.as_json(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                    ..Done::default()
                })
                .write_dialect(&mut sink, Style::Verbatim, dialect),
                OutMsg::Deregister { draining, reason } => Msg::Deregister(Deregister {
                    session_id: self.session.as_json(),
                    draining,
                    reason: JsonStr::plain(reason.as_str()),
                })
                .write_dialect(&mut sink, Style::Verbatim, dialect),
            }
            return Some(match sink.finish() {
                Ok(n) => {
                    self.outbox.transmits.pop();
                    Ok(n)
                }
                Err(e) => Err(e),
            });
        }
    }
}

/// A staged request as its announcement describes it.
struct StagedView<'r> {
    r: &'r Request,
    slot_offset: u64,
    data_size: u64,
    manifest: RawJson<'r>,
    scalar_fields: RawJson<'r>,
}

impl<'s> Instance<'s> {
    /// The request at `index` (of sequence `seq`), if it is still staged.
    fn staged_view(&self, index: usize, seq: u64) -> Option<StagedView<'_>> {
        let r = self
            .transfers
            .requests
            .get(index)
            .filter(|r| r.seq == seq)?;
        let Kind::Staged {
            ref slot,
            data_size,
            ..
        } = r.kind
        else {
            return None;
        };
        let (manifest, scalar_fields) = nested_json(
            &self.transfers.nested,
            index * self.transfers.chunk,
            r.manifest_len,
            r.scalars_len,
        );
        Some(StagedView {
            r,
            slot_offset: slot.offset(),
            data_size,
            manifest,
            scalar_fields,
        })
    }
}
