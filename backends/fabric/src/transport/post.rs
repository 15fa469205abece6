//! Writes and reads going out: each checked against the local region it
//! uses and the regions the peer's session id lists, split at the chunk
//! size, booked, and queued for the provider (what the queue does not take
//! at once, the progress thread posts as it drains).

use std::sync::Arc;
use std::time::Instant;

use tensorferry_core::transport::{OutsidePeerRegions, ReadOp, Region, WriteOp};
use tensorferry_fabric_sys as sys;

use super::book::{Chunk, OpState};
use super::FabricTransport;
use crate::error::{FabricError, OpKind};
use crate::mr::MrPolicy;
use crate::notice::NoticeFormat;
use crate::provider::DeliveryMode;

impl FabricTransport {
    /// The registered region `region` names, and its descriptor.
    fn local_region(&self, region: Region) -> Result<(Region, *mut std::ffi::c_void), FabricError> {
        let (r, mr) = self.regions.get(region.id)?;
        Ok((*r, mr.desc()))
    }

    /// Books `op` and queues its `chunks` chunks (`chunk(slot, i)` makes
    /// the `i`th), then posts what the provider takes now; the rest goes
    /// out from the progress thread as the queue drains.
    fn queue(&self, op: OpState, chunks: u64, chunk: impl Fn(u32, u64) -> Chunk) {
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
            book.backlog.push_back(chunk(w, i));
        }
        drop(book);
        if self.shared.drain() {
            // Wake the progress thread in case it sleeps.
            self.shared.cq().signal();
        }
    }

    /// Checks, splits and queues `read` (`Transport::post_read`).
    pub(super) fn queue_read(&mut self, read: &ReadOp<'_>) -> Result<(), FabricError> {
        let ReadOp {
            region,
            local_offset,
            len,
            src_session,
            src_addr,
            cookie,
        } = *read;
        if !self.opened.reads {
            return Err(FabricError::Unsupported {
                provider: self.opened.provider.clone(),
                what: format!(
                    "offers no one-sided reads (FI_READ, FI_REMOTE_READ): cannot read from {src_session}; writes work"
                ),
            });
        }
        let (r, desc) = self.local_region(region)?;
        r.check_source(local_offset, len)?;
        let chunk = self.opened.chunk;
        let peer = self.peer(src_session)?;
        let s = &peer.session;
        let Some(src) = s.region_for(src_addr, len) else {
            return Err(FabricError::OutsidePeer(OutsidePeerRegions {
                read: true,
                peer: src_session.to_owned(),
                addr: src_addr,
                len,
                regions: s.regions.len(),
            }));
        };
        let chunks = len.div_ceil(chunk).max(1);
        let (fi_addr, key, virt, base) = (peer.fi_addr, src.key, s.virt_addr, src.base);
        let name = Arc::clone(&peer.name);
        // A read's completion means its bytes are here at any completion
        // level. FI_DELIVERY_COMPLETE, a level for what is sent, is not
        // asked: shm would then have the peer copy into this process in
        // its own time instead of reading within the call. No remote CQ
        // data: a read gives the peer nothing to count.
        let flags = u64::from(sys::FI_COMPLETION);
        let now = Instant::now();
        let op = OpState {
            kind: OpKind::Read,
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer: name,
            posted: now,
            deadline: now + self.write_timeout,
            ended: false,
        };
        self.queue(op, chunks, |w, i| {
            let off = i * chunk;
            Chunk {
                op: w,
                kind: OpKind::Read,
                region: r.id,
                local: (r.addr + local_offset + off) as usize,
                len: chunk.min(len - off) as usize,
                desc: desc as usize,
                peer: fi_addr,
                remote: MrPolicy::remote_addr(virt, base, src_addr + off),
                key,
                data: 0,
                flags,
            }
        });
        Ok(())
    }

    /// Checks, splits and queues `write` (`Transport::post_write`).
    pub(super) fn queue_write(&mut self, write: &WriteOp<'_>) -> Result<(), FabricError> {
        let WriteOp {
            region,
            local_offset,
            len,
            dest_session,
            dest_addr,
            tag,
            cookie,
        } = *write;
        let (r, desc) = self.local_region(region)?;
        r.check_source(local_offset, len)?;
        let chunk = self.opened.chunk;
        let delivery = self.opened.delivery;
        let format_max = self.notice_format.max_chunks();
        let peer = self.peer(dest_session)?;
        let s = &peer.session;
        let Some(dest) = s.region_for(dest_addr, len) else {
            return Err(FabricError::OutsidePeer(OutsidePeerRegions {
                read: false,
                peer: dest_session.to_owned(),
                addr: dest_addr,
                len,
                regions: s.regions.len(),
            }));
        };
        let chunks = len.div_ceil(chunk).max(1);
        let peer_format = NoticeFormat::new(s.wide_data);
        if s.notify && chunks > peer_format.max_chunks().min(format_max) {
            return Err(FabricError::TooManyChunks {
                peer: dest_session.to_owned(),
                len,
                chunk,
                chunks,
                max: peer_format.max_chunks(),
            });
        }
        let (fi_addr, key, virt, base, notify) =
            (peer.fi_addr, dest.key, s.virt_addr, dest.base, s.notify);
        let name = Arc::clone(&peer.name);
        let mut flags = u64::from(sys::FI_COMPLETION);
        if delivery == DeliveryMode::Complete {
            flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        let data = if notify {
            flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
            peer_format.encode(tag, chunks)
        } else {
            0
        };
        let deadline = Instant::now() + self.write_timeout;
        let op = OpState {
            kind: OpKind::Write,
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer: name,
            posted: Instant::now(),
            deadline,
            ended: false,
        };
        self.queue(op, chunks, |w, i| {
            let off = i * chunk;
            Chunk {
                op: w,
                kind: OpKind::Write,
                region: r.id,
                local: (r.addr + local_offset + off) as usize,
                len: chunk.min(len - off) as usize,
                desc: desc as usize,
                peer: fi_addr,
                remote: MrPolicy::remote_addr(virt, base, dest_addr + off),
                key,
                data,
                flags,
            }
        });
        Ok(())
    }
}
