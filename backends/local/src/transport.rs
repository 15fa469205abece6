//! The local engine as a data plane of ferry's seam: [`LocalTransport`]
//! implements `ferry_core::transport::Transport`, so that whatever drives a
//! transport (a node's progress loop, a test's fault injector) drives this
//! one as it drives the others.
//!
//! A write is one `process_vm_writev` into the peer, done when
//! `post_write` returns: its completion is queued at once and means
//! delivery (the bytes are in the peer's memory).
// `Transport::register` is unsafe by its contract (registering memory
// hands its lifetime to the caller); nothing here dereferences.
#![allow(unsafe_code)]

use std::collections::VecDeque;

use ferry_core::transport::{Capabilities, Completion, Region, Transport, WriteOp};

use crate::{LocalConfig, LocalEngine, LocalError, Op};

/// A [`LocalEngine`] behind the `Transport` seam.
#[derive(Debug)]
pub struct LocalTransport {
    engine: LocalEngine,
    /// Regions registered, by id.
    regions: Vec<Region>,
    next_id: u32,
    done: VecDeque<Completion<LocalError>>,
}

impl LocalTransport {
    /// Opens an engine with no region registered.
    pub fn open(config: LocalConfig) -> Result<Self, LocalError> {
        Ok(Self {
            engine: LocalEngine::open(config)?,
            regions: Vec::new(),
            next_id: 1,
            done: VecDeque::new(),
        })
    }

    /// The engine underneath.
    pub fn engine(&self) -> &LocalEngine {
        &self.engine
    }
}

impl Transport for LocalTransport {
    type Error = LocalError;

    fn session_id(&self) -> &str {
        self.engine.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The engine splits a large write itself (over its threads and
            // into `process_vm_writev`'s iovec limit).
            max_write: u64::MAX,
            delivery_complete: true,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, LocalError> {
        let region = Region {
            id: self.next_id,
            addr: addr as u64,
            len: len as u64,
        };
        self.engine.register(region.addr, region.len)?;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.regions.push(region);
        Ok(region)
    }

    fn deregister(&mut self, region: Region) -> Result<(), LocalError> {
        let at = self
            .regions
            .iter()
            .position(|r| r.id == region.id)
            .ok_or(LocalError::NotRegistered { addr: region.addr })?;
        self.engine.deregister(self.regions[at].addr)?;
        self.regions.remove(at);
        Ok(())
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), LocalError> {
        let region = self
            .regions
            .iter()
            .find(|r| r.id == write.region.id)
            .copied()
            .ok_or(LocalError::SourceOutOfBounds {
                addr: write.region.addr.wrapping_add(write.local_offset),
                len: write.len,
            })?;
        let inside = write
            .local_offset
            .checked_add(write.len)
            .is_some_and(|end| end <= region.len);
        if !inside {
            return Err(LocalError::SourceOutOfBounds {
                addr: region.addr.wrapping_add(write.local_offset),
                len: write.len,
            });
        }
        let op = Op {
            src: region.addr + write.local_offset,
            dst: write.dest_addr,
            len: write.len,
        };
        // Done when the call returns: the completion says how it went.
        let result = self.engine.write(write.dest_session, &[op]);
        self.done.push_back(Completion {
            cookie: write.cookie,
            result,
        });
        Ok(())
    }

    fn poll_completion(&mut self) -> Option<Completion<LocalError>> {
        self.done.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use ferry_core::transport::{Fault, FaultKind, WriteTag};

    use super::*;

    fn write<'a>(region: Region, offset: u64, len: u64, to: &'a str, dst: u64) -> WriteOp<'a> {
        WriteOp {
            region,
            local_offset: offset,
            len,
            dest_session: to,
            dest_addr: dst,
            tag: WriteTag(0),
            cookie: 7,
        }
    }

    #[test]
    fn a_posted_write_lands_and_completes_at_once() {
        let mut a = LocalTransport::open(LocalConfig::default()).unwrap();
        let mut b = LocalTransport::open(LocalConfig::default()).unwrap();
        let mut src: Vec<u8> = (0..1u32 << 16).map(|i| (i * 5 + 1) as u8).collect();
        let mut dst = vec![0u8; 1 << 16];
        // SAFETY: both vectors outlive the transports' registrations
        // (deregistered below), and nothing reads `dst` while a write may
        // land in it.
        let ra = unsafe { a.register(src.as_mut_ptr(), src.len()) }.unwrap();
        // SAFETY: as above.
        let rb = unsafe { b.register(dst.as_mut_ptr(), dst.len()) }.unwrap();
        let to = b.session_id().to_owned();
        a.post_write(&write(ra, 16, 4096, &to, rb.addr + 64))
            .unwrap();
        let c = a.poll_completion().expect("completed at once");
        assert_eq!(c.cookie, 7);
        c.result.unwrap();
        assert_eq!(dst[64..64 + 4096], src[16..16 + 4096]);
        assert!(a.poll_completion().is_none());
        // Outside the source region: refused before anything is written.
        let e = a
            .post_write(&write(ra, src.len() as u64 - 8, 16, &to, rb.addr))
            .unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        // Outside the peer's region: the write fails, reported by its
        // completion.
        a.post_write(&write(ra, 0, 16, &to, rb.addr + rb.len))
            .unwrap();
        let e = a.poll_completion().unwrap().result.unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        a.deregister(ra).unwrap();
        b.deregister(rb).unwrap();
        assert!(a.deregister(ra).is_err());
    }
}
