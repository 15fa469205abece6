//! The instance's output: writes to post, events, and messages encoded into
//! the caller's buffer.

use super::*;

impl<'s> Instance<'s> {
    /// The next write to post.
    pub fn poll_action(&mut self) -> Option<Write> {
        self.actions.pop()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<InstanceEvent> {
        self.events.pop()
    }

    /// The next message for the coordinator, encoded into `buf`; one that
    /// does not fit stays queued and its size is returned.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<Result<usize, BufferTooSmall>> {
        // A registration offers every preallocated slot as free: it waits
        // until the application has let go of those it still holds (after
        // `reregister`), or a new coordinator would write into them.
        if self.register_due && self.prealloc_in_use() == 0 {
            let mut sink = Sink::new(buf);
            Msg::Register(Register {
                role: self.role.as_json(),
                session_id: self.session.as_json(),
                pool_ptr: self.pool_ptr,
                pool_size: self.config.pool.pool_size,
                work_endpoint: self.endpoint.as_json(),
                preallocated_slots: SlotList::Slots(&self.prealloc),
            })
            .write(&mut sink, Default::default());
            let r = sink.finish();
            if r.is_ok() {
                self.register_due = false;
            }
            return Some(r);
        }
        if !self.registered {
            // Nothing is announced to a coordinator that does not know us.
            return None;
        }
        loop {
            let Outgoing(m) = *self.transmits.front()?;
            let mut sink = Sink::new(buf);
            match m {
                OutMsg::Staged { index, seq } => {
                    let Some(r) = self
                        .requests
                        .get(index)
                        .and_then(Option::as_ref)
                        .filter(|r| r.seq == seq)
                    else {
                        self.transmits.pop();
                        continue;
                    };
                    let (slot_offset, data_size) = match &r.kind {
                        Kind::Staged { slot, data_size } => (slot.offset(), *data_size),
                        _ => {
                            self.transmits.pop();
                            continue;
                        }
                    };
                    let (manifest, scalar_fields) = nested_json(
                        &self.nested,
                        index * self.chunk,
                        r.manifest_len,
                        r.scalars_len,
                    );
                    Msg::Staged(Staged {
                        request_id: r.id.as_json(),
                        data_size,
                        manifest: Manifest::Raw(manifest),
                        session_id: self.session.as_json(),
                        pool_ptr: self.pool_ptr,
                        slot_offset,
                        scalar_fields,
                    })
                    .write(&mut sink, Default::default())
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
                .write(&mut sink, Default::default()),
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
                .write(&mut sink, Default::default()),
                OutMsg::Pushed { id, error } => Msg::Pushed(Pushed {
                    request_id: id.as_json(),
                    success: error.is_none(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                })
                .write(&mut sink, Default::default()),
                OutMsg::Done { id, error } => Msg::Done(Done {
                    request_id: id.as_json(),
                    error: error.as_ref().map(|e| JsonStr::plain(e.as_str())),
                })
                .write(&mut sink, Default::default()),
            }
            return Some(match sink.finish() {
                Ok(n) => {
                    self.transmits.pop();
                    Ok(n)
                }
                Err(e) => Err(e),
            });
        }
    }
}
