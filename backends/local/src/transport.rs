//! The local engine as a data plane of ferry's seam: [`LocalTransport`]
//! implements `tensorferry_core::transport::Transport`, so that whatever drives a
//! transport (a node's progress loop, the transfer engine, a test's fault
//! injector) drives this one as it drives the others.
//!
//! Writes and reads are posted as a NIC's are and made at the next poll,
//! in posting order: the writes posted in a row to one peer are made
//! together, in as few `process_vm_writev` calls as the kernel takes (a
//! batch of small tensors costs one call, not one per tensor), and so are
//! the reads in a row from one peer (`process_vm_readv`); a large one is
//! cut over the engine's copy threads. Posting is a queue push: a poster
//! that shares the transport behind a lock holds it for no copy. A
//! completion means delivery: a write's bytes are in the peer's memory, a
//! read's in this process's.
// `Transport::register` is unsafe by its contract (registering memory
// hands its lifetime to the caller); nothing here dereferences.
#![allow(unsafe_code)]

use std::collections::VecDeque;

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, OpSpan, PoolOwner, ReadOp, Region, Regions, Transport,
    WriteOp,
};
use tensorferry_hostmem::{EventFd, HostPool};

use crate::{Direction, LocalConfig, LocalEngine, LocalError, Op};

/// Writes to one peer, or reads from it, posted in a row and not yet made.
#[derive(Debug)]
struct Posted {
    session: String,
    dir: Direction,
    ops: Vec<Op>,
    cookies: Vec<u64>,
}

/// A [`LocalEngine`] behind the `Transport` seam (see the module's
/// documentation).
#[derive(Debug)]
pub struct LocalTransport {
    engine: LocalEngine,
    /// Regions registered, by id.
    regions: Regions<()>,
    posted: Vec<Posted>,
    done: VecDeque<Completion<LocalError>>,
    /// Offered as the wake descriptor, and never signalled: this plane
    /// has no news of its own (its copies are made by the poller), so a
    /// driver that waits on it sleeps rather than polls.
    wake: EventFd,
    /// A node's pool, if it has one (declared after `engine`, so that it
    /// is unmapped only once the engine's drop has waited out every
    /// peer's copy into it).
    pool: Option<HostPool>,
}

impl LocalTransport {
    /// Opens an engine with no region registered.
    pub fn open(config: LocalConfig) -> Result<Self, LocalError> {
        let wake = EventFd::new().map_err(|source| LocalError::Sys {
            call: "eventfd",
            source,
        })?;
        Ok(Self {
            engine: LocalEngine::open(config)?,
            regions: Regions::new(crate::MAX_REGIONS),
            posted: Vec::new(),
            done: VecDeque::new(),
            wake,
            pool: None,
        })
    }

    /// Opens an engine that owns a pool of `pool_len` bytes of anonymous
    /// memory (not registered yet): what a ferry node receives into and
    /// stages in over this plane.
    pub fn with_pool(config: LocalConfig, pool_len: usize) -> Result<Self, LocalError> {
        let pool = HostPool::new(pool_len).map_err(|source| LocalError::Sys {
            call: "map the pool",
            source,
        })?;
        let mut t = Self::open(config)?;
        t.pool = Some(pool);
        Ok(t)
    }

    /// The engine underneath.
    pub fn engine(&self) -> &LocalEngine {
        &self.engine
    }

    /// Makes the posted writes and reads, in order: each run in one engine
    /// call; where that fails, one by one, so that each completion says
    /// how its own op went.
    fn make_posted(&mut self) {
        for p in self.posted.drain(..) {
            match self.engine.transfer(&p.session, &p.ops, p.dir) {
                Ok(()) => self.done.extend(p.cookies.iter().map(|&cookie| Completion {
                    cookie,
                    result: Ok(()),
                })),
                Err(e) if p.ops.len() == 1 => self.done.push_back(Completion {
                    cookie: p.cookies[0],
                    result: Err(e),
                }),
                // Rewriting the ones that landed writes the same bytes
                // again: the sources do not change while their writes are
                // posted. Rereading gives the peer's bytes as they are now,
                // which is what any read of memory the peer owns gives.
                Err(_) => {
                    for (op, &cookie) in p.ops.iter().zip(&p.cookies) {
                        let result =
                            self.engine
                                .transfer(&p.session, std::slice::from_ref(op), p.dir);
                        self.done.push_back(Completion { cookie, result });
                    }
                }
            }
        }
    }

    /// Checks `span`'s side in this process against its region, and
    /// queues it as `dir` says: a write from there to the peer, or a read
    /// from the peer into there. The peer's side is checked when the op
    /// is made, against the peer's table.
    fn queue(&mut self, dir: Direction, span: OpSpan<'_>) -> Result<(), LocalError> {
        let local = match self
            .regions
            .source(span.region, span.local_offset, span.len)
        {
            Ok((r, ())) => r.addr + span.local_offset,
            Err(_) => {
                let (addr, len) = (span.region.addr.wrapping_add(span.local_offset), span.len);
                return Err(dir.outside_own(addr, len).into());
            }
        };
        let (src, dst) = match dir {
            Direction::Write => (local, span.remote_addr),
            Direction::Read => (span.remote_addr, local),
        };
        let op = Op {
            src,
            dst,
            len: span.len,
        };
        self.post(span.peer, dir, op, span.cookie);
        Ok(())
    }

    /// Queues `op` behind the last run when that is the same peer's and
    /// the same way, else as a new run.
    fn post(&mut self, session: &str, dir: Direction, op: Op, cookie: u64) {
        match self.posted.last_mut() {
            Some(p) if p.dir == dir && p.session == session => {
                p.ops.push(op);
                p.cookies.push(cookie);
            }
            _ => {
                // No wake: the poster polls next (the seam's callers
                // post, then poll), and waking a driver thread would only
                // have it contend for the transport with the poster.
                self.posted.push(Posted {
                    session: session.to_owned(),
                    dir,
                    ops: vec![op],
                    cookies: vec![cookie],
                });
            }
        }
    }
}

// SAFETY: the pool is a `HostPool` the transport owns as a field (set by
// `with_pool`, never taken out): mapped at creation, the same range for its
// life, unmapped when the transport drops, after the engine (an earlier
// field), whose drop waits until no peer copies into a registered region;
// moving the transport does not move the mapping. Without a pool the range
// is empty, which a node refuses.
#[allow(unsafe_code)]
unsafe impl PoolOwner for LocalTransport {
    fn pool_ptr(&self) -> *mut u8 {
        self.pool.as_ref().map_or(std::ptr::null_mut(), |p| p.ptr())
    }

    fn pool_len(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.len())
    }
}

impl Transport for LocalTransport {
    type Error = LocalError;

    fn fault_kind(error: &LocalError) -> FaultKind {
        error.kind()
    }

    fn session_id(&self) -> &str {
        self.engine.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The engine splits a large write itself (over its threads and
            // into `process_vm_writev`'s iovec limit).
            max_write: u64::MAX,
            delivery_complete: true,
            // Made within the poll that takes it up, by this process.
            write_lifetime: std::time::Duration::ZERO,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, LocalError> {
        let (addr, len) = (addr as u64, len as u64);
        let full = |_| LocalError::Register {
            addr,
            len,
            why: "this engine holds the most regions it can (256)",
        };
        // Room first, so that the engine's table and this one hold the
        // same regions.
        self.regions.check_room().map_err(full)?;
        // SAFETY: the caller's contract, passed on.
        unsafe { self.engine.register(addr, len) }?;
        self.regions.insert(addr, len, ()).map_err(|e| {
            // Not the caller's region after all: out of the engine's too.
            let _ = self.engine.deregister(addr);
            full(e)
        })
    }

    /// Makes the writes and reads posted so far first, since any of them
    /// may read the region (a write) or write into it (a read), then ends
    /// it.
    fn deregister(&mut self, region: Region) -> Result<(), LocalError> {
        let (&r, ()) = self
            .regions
            .get(region.id)
            .map_err(|_| LocalError::NotRegistered { addr: region.addr })?;
        self.make_posted();
        self.engine.deregister(r.addr)?;
        let _ = self.regions.remove(r);
        Ok(())
    }

    /// Posts `read`: this process's side (the destination) is checked
    /// here, against the region, as a write's source is; the peer's side
    /// when the read is made, against the peer's table.
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), LocalError> {
        self.queue(Direction::Read, read.span())
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), LocalError> {
        self.queue(Direction::Write, write.span())
    }

    fn poll_completion(&mut self) -> Option<Completion<LocalError>> {
        if !self.posted.is_empty() {
            self.make_posted();
        }
        // The wake descriptor is never signalled, so there is nothing to
        // clear (a read would be a system call per poll).
        self.done.pop_front()
    }

    /// Ends the writes to the peer and reads from it not yet made: each is
    /// made within one poll, so none is halfway, and the ones still posted
    /// are dropped unmade.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), LocalError> {
        let mut kept = Vec::with_capacity(self.posted.len());
        for p in self.posted.drain(..) {
            if p.session == session {
                self.done.extend(p.cookies.iter().map(|&cookie| Completion {
                    cookie,
                    result: Err(LocalError::Cancelled {
                        session: p.session.clone(),
                        direction: p.dir,
                    }),
                }));
            } else {
                kept.push(p);
            }
        }
        self.posted = kept;
        Ok(())
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.wake.fd())
    }
}

#[cfg(test)]
mod tests {
    use tensorferry_core::transport::FaultKind;

    use super::*;

    /// A write of cookie 7 (what these tests' completions check).
    fn write(region: Region, offset: u64, len: u64, to: &str, dst: u64) -> WriteOp<'_> {
        crate::tests_read::write(region, offset, len, to, dst, 7)
    }

    fn readable(fd: std::os::fd::RawFd, wait_ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, a descriptor the transport owns.
        unsafe { libc::poll(&mut p, 1, wait_ms) == 1 }
    }

    /// Two transports: `a` with `src` registered (`ra`), `b` with as many
    /// zeroes (`dst`, registered as `rb`), and `b`'s session id (`to`).
    struct Two {
        a: LocalTransport,
        b: LocalTransport,
        src: Vec<u8>,
        dst: Vec<u8>,
        ra: Region,
        rb: Region,
        to: String,
    }

    /// [`Two`] transports of `config`, `a` to write `src` to `b`.
    fn two(config: LocalConfig, mut src: Vec<u8>) -> Two {
        let mut a = LocalTransport::open(config.clone()).unwrap();
        let mut b = LocalTransport::open(config).unwrap();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: the vectors' buffers stay where they are when the
        // vectors move, and the tests keep them until they have
        // deregistered both regions; nothing reads `dst` while a write
        // may land in it.
        let ra = unsafe { a.register(src.as_mut_ptr(), src.len()) }.unwrap();
        // SAFETY: as above.
        let rb = unsafe { b.register(dst.as_mut_ptr(), dst.len()) }.unwrap();
        let to = b.session_id().to_owned();
        Two {
            a,
            b,
            src,
            dst,
            ra,
            rb,
            to,
        }
    }

    #[test]
    fn a_posted_short_write_lands_when_completions_are_polled() {
        let src = (0..1u32 << 16).map(|i| (i * 5 + 1) as u8).collect();
        let mut t = two(LocalConfig::default(), src);
        let fd = t.a.wake_fd().unwrap();
        t.a.post_write(&write(t.ra, 16, 4096, &t.to, t.rb.addr + 64))
            .unwrap();
        // Posted, not made: nothing moved, and no driver is woken (the
        // poster polls next).
        assert!(t.dst.iter().all(|&x| x == 0));
        assert!(!readable(fd, 0));
        let c = t.a.poll_completion().expect("made by the poll");
        assert_eq!(c.cookie, 7);
        c.result.unwrap();
        assert_eq!(t.dst[64..64 + 4096], t.src[16..16 + 4096]);
        assert!(t.a.poll_completion().is_none());
        // Outside the source region: refused before anything is written.
        let e =
            t.a.post_write(&write(t.ra, t.src.len() as u64 - 8, 16, &t.to, t.rb.addr))
                .unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        // Outside the peer's region: the write fails, reported by its
        // completion.
        t.a.post_write(&write(t.ra, 0, 16, &t.to, t.rb.addr + t.rb.len))
            .unwrap();
        let e = t.a.poll_completion().unwrap().result.unwrap_err();
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        t.a.deregister(t.ra).unwrap();
        t.b.deregister(t.rb).unwrap();
        assert!(t.a.deregister(t.ra).is_err());
    }

    #[test]
    fn a_batch_fails_only_its_bad_write() {
        let src = (0..1u32 << 16).map(|i| (i * 3 + 2) as u8).collect();
        let mut t = two(LocalConfig::default(), src);
        for i in 0..100u64 {
            // Write 50 aims past the peer's region.
            let dest = if i == 50 {
                t.rb.addr + t.rb.len
            } else {
                t.rb.addr + i * 512
            };
            let mut w = write(t.ra, i * 256, 256, &t.to, dest);
            w.cookie = i;
            t.a.post_write(&w).unwrap();
        }
        let mut seen = 0;
        while let Some(c) = t.a.poll_completion() {
            assert_eq!(c.result.is_err(), c.cookie == 50, "write {}", c.cookie);
            seen += 1;
        }
        assert_eq!(seen, 100);
        for i in (0..100usize).filter(|&i| i != 50) {
            assert_eq!(
                t.dst[i * 512..i * 512 + 256],
                t.src[i * 256..i * 256 + 256],
                "write {i}"
            );
        }
        t.a.deregister(t.ra).unwrap();
        t.b.deregister(t.rb).unwrap();
    }

    #[test]
    fn cancelled_writes_are_never_made_and_complete_as_timed_out() {
        let mut a = LocalTransport::open(LocalConfig::default()).unwrap();
        let mut b = LocalTransport::open(LocalConfig::default()).unwrap();
        let mut c = LocalTransport::open(LocalConfig::default()).unwrap();
        let mut src = vec![9u8; 8192];
        let mut to_b = vec![0u8; 4096];
        let mut to_c = vec![0u8; 4096];
        // SAFETY: the vectors outlive the transports' registrations
        // (deregistered below), and nothing reads them while a write may
        // land in them.
        let ra = unsafe { a.register(src.as_mut_ptr(), src.len()) }.unwrap();
        // SAFETY: as above.
        let rb = unsafe { b.register(to_b.as_mut_ptr(), to_b.len()) }.unwrap();
        // SAFETY: as above.
        let rc = unsafe { c.register(to_c.as_mut_ptr(), to_c.len()) }.unwrap();
        let (sb, sc) = (b.session_id().to_owned(), c.session_id().to_owned());
        for (i, (to, dst)) in [(&sb, rb.addr), (&sc, rc.addr), (&sb, rb.addr + 2048)]
            .into_iter()
            .enumerate()
        {
            let mut w = write(ra, 0, 2048, to, dst);
            w.cookie = i as u64;
            a.post_write(&w).unwrap();
        }
        a.cancel_transfers(&sb).unwrap();
        // The source changes after the cancel: a write made later would
        // carry the new bytes.
        src.fill(5);
        let mut outcomes: Vec<(u64, Option<FaultKind>)> =
            std::iter::from_fn(|| a.poll_completion())
                .map(|c| (c.cookie, c.result.err().map(|e| e.kind())))
                .collect();
        outcomes.sort_by_key(|o| o.0);
        assert_eq!(
            outcomes,
            vec![
                (0, Some(FaultKind::Timeout)),
                (1, None),
                (2, Some(FaultKind::Timeout)),
            ]
        );
        assert!(to_b.iter().all(|&x| x == 0), "a cancelled write was made");
        assert!(
            to_c[..2048].iter().all(|&x| x == 5),
            "the other peer's write goes on"
        );
        for (t, r) in [(&mut a, ra), (&mut b, rb), (&mut c, rc)] {
            t.deregister(r).unwrap();
        }
    }

    #[test]
    fn a_large_write_lands_and_deregister_makes_what_was_posted_first() {
        let config = LocalConfig {
            threads: 2,
            ..LocalConfig::default()
        };
        let len = 32usize << 20;
        let mut t = two(config, (0..len).map(|i| (i % 249) as u8).collect());
        t.a.post_write(&write(t.ra, 0, len as u64, &t.to, t.rb.addr))
            .unwrap();
        t.a.poll_completion().unwrap().result.unwrap();
        assert!(t.dst == t.src);
        // Posted, then deregistered: made before the region ends.
        t.dst.fill(0);
        t.a.post_write(&write(t.ra, 0, len as u64, &t.to, t.rb.addr))
            .unwrap();
        t.a.deregister(t.ra).unwrap();
        assert!(
            t.dst == t.src,
            "deregister ended the region before its write"
        );
        t.a.poll_completion().unwrap().result.unwrap();
        t.b.deregister(t.rb).unwrap();
    }
}
