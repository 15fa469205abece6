//! Writes and reads going out: each checked against the local region it
//! uses and the regions the peer's session id lists, split at the chunk
//! size, booked, and queued for the provider (what the queue does not take
//! at once, the progress thread posts as it drains).

use std::sync::Arc;
use std::time::Instant;

use tensorferry_core::transport::{OpSpan, OutsidePeerRegions, ReadOp, Region, WriteOp};
use tensorferry_fabric_sys as sys;

use super::book::{Chunk, OpState};
use super::FabricTransport;
use crate::error::{FabricError, OpKind};
use crate::mr::MrPolicy;
use crate::notice::NoticeFormat;
use crate::provider::DeliveryMode;

/// A write or read checked against both ends: one chunk of its whole
/// length, and what the peer's session says of it.
struct Checked {
    whole: Chunk,
    /// The peer's session id.
    peer: Arc<str>,
    /// The peer counts remote CQ data before accepting `transfer_ready`
    /// (a write carries its notice).
    notify: bool,
    /// The peer's CQ data is 8 bytes wide.
    wide_data: bool,
}

impl FabricTransport {
    /// The registered region `region` names, and its descriptor.
    fn local_region(&self, region: Region) -> Result<(Region, *mut std::ffi::c_void), FabricError> {
        let (r, mr) = self.regions.get(region.id)?;
        Ok((*r, mr.desc()))
    }

    /// Checks a write (`kind` Write) or read of `span`: its local bytes
    /// against the local region, its remote ones against the regions its
    /// peer's session lists; and makes it one chunk of its whole length
    /// (no flags nor data yet).
    fn check(&mut self, kind: OpKind, span: OpSpan<'_>) -> Result<Checked, FabricError> {
        let OpSpan {
            region,
            local_offset,
            len,
            peer: session,
            remote_addr,
            ..
        } = span;
        let (r, desc) = self.local_region(region)?;
        r.check_source(local_offset, len)?;
        let peer = self.peer(session)?;
        let s = &peer.session;
        let Some(remote) = s.region_for(remote_addr, len) else {
            return Err(FabricError::OutsidePeer(OutsidePeerRegions {
                read: kind == OpKind::Read,
                peer: session.to_owned(),
                addr: remote_addr,
                len,
                regions: s.regions.len(),
            }));
        };
        let whole = Chunk {
            op: 0,
            kind,
            region: r.id,
            local: (r.addr + local_offset) as usize,
            len: len as usize,
            desc: desc as usize,
            peer: peer.fi_addr,
            remote: MrPolicy::remote_addr(s.virt_addr, remote.base, remote_addr),
            key: remote.key,
            data: 0,
            flags: 0,
        };
        Ok(Checked {
            whole,
            peer: Arc::clone(&peer.name),
            notify: s.notify,
            wide_data: s.wide_data,
        })
    }

    /// How many chunks `len` bytes go out in (one at least: a zero-byte
    /// transfer is still booked and completed).
    fn chunks_of(&self, len: u64) -> u64 {
        len.div_ceil(self.opened.chunk).max(1)
    }

    /// Books the write or read `whole` (one chunk of the op's whole
    /// length, its slot yet to be given) for `cookie` and `peer`, and
    /// queues it split at the chunk size, each chunk's local and remote
    /// address advanced by its offset; then posts what the provider takes
    /// now; the rest goes out from the progress thread as the queue drains.
    fn queue(&self, cookie: u64, peer: Arc<str>, whole: Chunk) {
        let (len, chunk) = (whole.len as u64, self.opened.chunk);
        let chunks = self.chunks_of(len);
        let now = Instant::now();
        let op = OpState {
            kind: whole.kind,
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer,
            posted: now,
            deadline: now + self.write_timeout,
            ended: false,
        };
        let mut book = self.shared.lock();
        let w = match book.free_ops.pop() {
            Some(w) => {
                book.ops[w as usize] = Some(op);
                w
            }
            None => {
                book.ops.push(Some(op));
                (book.ops.len() - 1) as u32
            }
        };
        for i in 0..chunks {
            let off = i * chunk;
            book.backlog.push_back(Chunk {
                op: w,
                local: whole.local + off as usize,
                len: chunk.min(len - off) as usize,
                remote: whole.remote + off,
                ..whole
            });
        }
        drop(book);
        if self.shared.drain() {
            // Wake the progress thread in case it sleeps.
            self.shared.cq().signal();
        }
    }

    /// Checks, splits and queues `read` (`Transport::post_read`).
    pub(super) fn queue_read(&mut self, read: &ReadOp<'_>) -> Result<(), FabricError> {
        if !self.opened.reads {
            return Err(FabricError::Unsupported {
                provider: self.opened.provider.clone(),
                what: format!(
                    "offers no one-sided reads (FI_READ, FI_REMOTE_READ): cannot read from {}; writes work",
                    read.src_session
                ),
            });
        }
        let mut checked = self.check(OpKind::Read, read.span())?;
        // A read's completion means its bytes are here at any completion
        // level. FI_DELIVERY_COMPLETE, a level for what is sent, is not
        // asked: shm would then have the peer copy into this process in
        // its own time instead of reading within the call. No remote CQ
        // data: a read gives the peer nothing to count.
        checked.whole.flags = u64::from(sys::FI_COMPLETION);
        self.queue(read.cookie, checked.peer, checked.whole);
        Ok(())
    }

    /// Checks, splits and queues `write` (`Transport::post_write`).
    pub(super) fn queue_write(&mut self, write: &WriteOp<'_>) -> Result<(), FabricError> {
        let Checked {
            mut whole,
            peer,
            notify,
            wide_data,
        } = self.check(OpKind::Write, write.span())?;
        let len = write.len;
        let chunks = self.chunks_of(len);
        let peer_format = NoticeFormat::new(wide_data);
        let most = peer_format
            .max_chunks()
            .min(self.notice_format.max_chunks());
        if notify && chunks > most {
            return Err(FabricError::TooManyChunks {
                peer: write.dest_session.to_owned(),
                len,
                chunk: self.opened.chunk,
                chunks,
                max: peer_format.max_chunks(),
            });
        }
        whole.flags = u64::from(sys::FI_COMPLETION);
        if self.opened.delivery == DeliveryMode::Complete {
            whole.flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        if notify {
            whole.flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
            whole.data = peer_format.encode(write.tag, chunks);
        }
        self.queue(write.cookie, peer, whole);
        Ok(())
    }
}
