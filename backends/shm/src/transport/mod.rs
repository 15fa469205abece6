//! tensorferry-core's `Transport` over shared memory: a write is a bounds-checked
//! copy into a cached mapping of the peer's pool object.
//!
//! The peers' pools, mapped on first use, are kept in `peers`.

mod peers;

use std::collections::{HashMap, VecDeque};

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, PoolOwner, ReadOp, Region, Regions, Transport, WriteOp,
};
use tensorferry_hostmem::Copier;

use crate::error::ShmError;
use crate::guard::Guard;
use crate::pool::ShmPool;
use crate::session::SessionId;
use peers::Peer;

/// Room for completions kept at first (writes complete at once, so a
/// runtime drains them after every post; more grow the queue).
const COMPLETIONS: usize = 64;

/// The shared-memory transport of one process: its own pool, and the
/// mappings of the peers it wrote to.
#[derive(Debug)]
pub struct ShmTransport {
    pool: ShmPool,
    session: String,
    regions: Regions<()>,
    peers: HashMap<String, Peer>,
    /// The cookies of writes made and not yet polled (every write that is
    /// posted is made, so each completion is a success). Never dropped:
    /// each is a write its caller posted and will poll for, eight bytes a
    /// write the caller has not collected yet.
    done: VecDeque<u64>,
    copier: Copier,
}

impl ShmTransport {
    /// A transport with a new pool of `pool_len` bytes; copies of
    /// `split_at` bytes or more are spread over `threads` threads.
    pub fn new(pool_len: usize, threads: usize, split_at: usize) -> Result<Self, ShmError> {
        let pool = ShmPool::create(pool_len)?;
        let copier =
            Copier::new(threads, split_at, "ferry-copy").map_err(|source| ShmError::Sys {
                call: "start the copy threads",
                name: pool.name().to_owned(),
                source,
            })?;
        let session = SessionId {
            name: pool.name(),
            base: pool.as_ptr() as u64,
            len: pool_len as u64,
        }
        .to_string();
        Ok(Self {
            pool,
            session,
            regions: Regions::new(usize::MAX),
            peers: HashMap::new(),
            done: VecDeque::with_capacity(COMPLETIONS),
            copier,
        })
    }

    /// The pool's first byte in this process.
    ///
    /// The pool stays mapped, at this address, for as long as the
    /// transport lives and is released only by its drop: ferry's runtime
    /// relies on it (its [`PoolOwner`] promise), so no method may unmap
    /// or replace it.
    pub fn pool_ptr(&self) -> *mut u8 {
        self.pool.as_ptr()
    }

    /// The pool's length.
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// Threads a large write uses.
    pub fn copy_threads(&self) -> usize {
        self.copier.threads()
    }
}

// SAFETY: the pool is a `ShmPool` the transport owns as a field: mapped at
// creation, the same range for its life, unmapped only in its drop;
// moving the transport does not move the mapping, and none of its
// methods unmaps it.
#[allow(unsafe_code)]
unsafe impl PoolOwner for ShmTransport {
    fn pool_ptr(&self) -> *mut u8 {
        ShmTransport::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        ShmTransport::pool_len(self)
    }
}

impl Transport for ShmTransport {
    type Error = ShmError;

    fn fault_kind(error: &ShmError) -> FaultKind {
        error.kind()
    }

    fn session_id(&self) -> &str {
        &self.session
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_write: self.pool.len() as u64,
            // The copy is done when the completion is queued.
            delivery_complete: true,
            // Made within `post_write`, by the sender's own thread.
            write_lifetime: std::time::Duration::ZERO,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, ShmError> {
        let (start, pool_start) = (addr as u64, self.pool.as_ptr() as u64);
        let inside = start >= pool_start
            && start
                .checked_add(len as u64)
                .is_some_and(|end| end <= pool_start + self.pool.len() as u64);
        if !inside || len == 0 {
            return Err(ShmError::NotShared {
                addr: start,
                len: len as u64,
            });
        }
        Ok(self.regions.insert(start, len as u64, ())?)
    }

    fn deregister(&mut self, region: Region) -> Result<(), ShmError> {
        Ok(self.regions.remove(region)?)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), ShmError> {
        let WriteOp {
            region,
            local_offset,
            len,
            dest_session,
            dest_addr,
            cookie,
            ..
        } = *write;
        let (&r, ()) = self.regions.source(region, local_offset, len)?;
        let src = (r.addr + local_offset) as *const u8;
        let own = dest_session == self.session;
        let (dst_map, base, pool_len) = if own {
            (
                self.pool.as_ptr(),
                self.pool.as_ptr() as u64,
                self.pool.len() as u64,
            )
        } else {
            let p = self.peer(dest_session)?;
            (p.map.as_ptr(), p.base, p.len)
        };
        let offset = dest_addr.wrapping_sub(base);
        if dest_addr < base || offset.checked_add(len).is_none_or(|end| end > pool_len) {
            return Err(ShmError::DestOutOfBounds {
                session: dest_session.to_owned(),
                addr: dest_addr,
                len,
                base,
                pool_len,
            });
        }
        // Both ranges were checked against their mappings above.
        let (dst, n) = (dst_map.wrapping_add(offset as usize), len as usize);
        let overlap = own && (src as usize) < dst as usize + n && (dst as usize) < src as usize + n;
        if overlap {
            // SAFETY: both ranges lie in this process's own live pool
            // mapping (checked above); `copy` allows overlap.
            unsafe { std::ptr::copy(src, dst, n) };
        } else {
            // SAFETY: src lies in a registered region of our pool, dst in a
            // live mapping of the destination pool (own or peer's, held in
            // `self` for the whole call); both bounds were checked above and
            // the ranges are disjoint. Peers only write into slots the
            // coordinator assigned them, never into this staged source. A
            // peer's object may shrink under the copy: its mapping is
            // guarded, and the fault is seen just below.
            unsafe { self.copier.copy(dst, src, n) };
            if !own {
                let shrank = self
                    .peers
                    .get(dest_session)
                    .is_some_and(|p| p.guard.as_ref().is_some_and(Guard::take_fault));
                if shrank {
                    // Mapped again (and its size checked) on the next write.
                    let actual = self
                        .peers
                        .remove(dest_session)
                        .and_then(|p| p.map.object_state().ok())
                        .map_or(0, |(_, size)| size);
                    return Err(ShmError::PeerShrank {
                        session: dest_session.to_owned(),
                        claimed: pool_len,
                        actual,
                    });
                }
            }
        }
        self.done.push_back(cookie);
        Ok(())
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), ShmError> {
        Err(ShmError::ReadUnsupported {
            session: read.src_session.to_owned(),
            len: read.len,
        })
    }

    /// Nothing to end: a write is copied within its `post_write`, so no
    /// write is in flight between calls.
    fn cancel_transfers(&mut self, _dest_session: &str) -> Result<(), ShmError> {
        Ok(())
    }

    fn poll_completion(&mut self) -> Option<Completion<ShmError>> {
        self.done.pop_front().map(|cookie| Completion {
            cookie,
            result: Ok(()),
        })
    }

    // Writes complete on the caller's thread: nothing to wake it for
    // (`wake_fd`'s default).
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorferry_core::transport::{RegionError, WriteTag};

    /// A write of `len` bytes from `local_offset` of `region` to
    /// `dest_addr` at `to`, untagged.
    fn write_op(
        region: Region,
        local_offset: u64,
        len: u64,
        to: &str,
        dest_addr: u64,
        cookie: u64,
    ) -> WriteOp<'_> {
        WriteOp {
            region,
            local_offset,
            len,
            dest_session: to,
            dest_addr,
            tag: WriteTag(0),
            cookie,
        }
    }

    fn pair() -> (ShmTransport, Region, ShmTransport) {
        let mut a = ShmTransport::new(1 << 20, 2, 64 << 10).unwrap();
        // SAFETY: the whole pool of `a`, alive as long as `a`.
        let region = unsafe { a.register(a.pool_ptr(), a.pool_len()).unwrap() };
        let b = ShmTransport::new(1 << 20, 1, 64 << 10).unwrap();
        (a, region, b)
    }

    #[test]
    fn a_write_lands_in_the_peer_pool() {
        let (mut a, region, b) = pair();
        // SAFETY: offsets inside the 1 MiB pools of live transports.
        unsafe {
            for i in 0..300_000 {
                *a.pool_ptr().add(1000 + i) = (i % 251) as u8;
            }
        }
        let dest = b.pool_ptr() as u64 + 4096;
        a.post_write(&write_op(region, 1000, 300_000, b.session_id(), dest, 9))
            .unwrap();
        let c = a.poll_completion().unwrap();
        assert_eq!((c.cookie, c.result.is_ok()), (9, true));
        // SAFETY: the range lies inside b's live pool.
        let got = unsafe { std::slice::from_raw_parts(b.pool_ptr().add(4096), 300_000) };
        assert!(got.iter().enumerate().all(|(i, &v)| v == (i % 251) as u8));
    }

    #[test]
    fn every_completion_comes_back_however_many_wait() {
        let (mut a, region, b) = pair();
        let n = 10_000u64;
        for cookie in 0..n {
            a.post_write(&WriteOp {
                region,
                local_offset: 0,
                len: 64,
                dest_session: b.session_id(),
                dest_addr: b.pool_ptr() as u64,
                tag: WriteTag(cookie),
                cookie,
            })
            .unwrap();
        }
        let got: Vec<u64> = std::iter::from_fn(|| a.poll_completion())
            .map(|c| {
                assert!(c.result.is_ok());
                c.cookie
            })
            .collect();
        assert_eq!(got, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn a_peer_that_shrinks_its_pool_gets_a_typed_error_not_sigbus() {
        use tensorferry_core::transport::FaultKind;
        let (mut a, region, b) = pair();
        let s = b.session_id().to_owned();
        let base = b.pool_ptr() as u64;
        let write = |a: &mut ShmTransport| {
            a.post_write(&write_op(region, 0, 64 << 10, &s, base + (512 << 10), 3))
        };
        write(&mut a).unwrap();
        assert!(a.poll_completion().unwrap().result.is_ok());
        // The receiver shrinks its object behind the sender's back, after
        // the sender mapped it (a plain copy there would raise SIGBUS).
        let name = SessionId::parse(b.session_id()).unwrap().name;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm{name}"))
            .unwrap();
        f.set_len(4096).unwrap();
        let e = write(&mut a).unwrap_err();
        assert!(
            matches!(e, ShmError::PeerShrank { actual: 4096, claimed, .. } if claimed == 1 << 20),
            "{e}"
        );
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
        assert!(a.poll_completion().is_none());
        // Still refused (mapped again, its size checked), and the sender
        // lives on: its own pool takes writes as before.
        assert!(matches!(
            write(&mut a),
            Err(ShmError::ShortObject { .. } | ShmError::PeerShrank { .. })
        ));
        let own = a.session_id().to_owned();
        let own_base = a.pool_ptr() as u64;
        a.post_write(&write_op(region, 0, 4096, &own, own_base + (256 << 10), 4))
            .unwrap();
        assert!(a.poll_completion().unwrap().result.is_ok());
    }

    #[test]
    fn a_peer_shrinking_and_growing_its_pool_under_writes_never_kills_the_sender() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (mut a, region, b) = pair();
        let s = b.session_id().to_owned();
        let base = b.pool_ptr() as u64;
        let name = SessionId::parse(&s).unwrap().name.to_owned();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        // The receiver's owner flips its object's size as fast as it can.
        let flipper = std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/dev/shm{name}"))
                .unwrap();
            while !flag.load(Ordering::Relaxed) {
                f.set_len(4096).unwrap();
                f.set_len(1 << 20).unwrap();
            }
        });
        let (mut ok, mut refused) = (0, 0);
        for i in 0..3000 {
            let r = a.post_write(&write_op(region, 0, 256 << 10, &s, base + (512 << 10), i));
            match r {
                Ok(()) => {
                    assert!(a.poll_completion().unwrap().result.is_ok());
                    ok += 1;
                }
                Err(ShmError::PeerShrank { .. } | ShmError::ShortObject { .. }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        assert!(refused > 0, "{ok} writes, none refused");
    }

    #[test]
    fn out_of_bounds_and_unknown_peers_are_typed_errors() {
        let (mut a, region, b) = pair();
        let base = b.pool_ptr() as u64;
        let s = b.session_id().to_owned();
        let e = a.post_write(&write_op(region, 0, 4096, &s, base + (1 << 20) - 100, 1));
        assert!(matches!(e, Err(ShmError::DestOutOfBounds { .. })), "{e:?}");
        let e = a.post_write(&write_op(region, 0, 4096, &s, base - 1, 1));
        assert!(matches!(e, Err(ShmError::DestOutOfBounds { .. })), "{e:?}");
        let e = a.post_write(&write_op(region, (1 << 20) - 10, 4096, &s, base, 1));
        assert!(
            matches!(
                e,
                Err(ShmError::Region(RegionError::SourceOutOfBounds { .. }))
            ),
            "{e:?}"
        );
        let e = a.post_write(&write_op(region, 0, 1, "shm:nonsense", base, 1));
        assert!(matches!(e, Err(ShmError::BadSession { .. })), "{e:?}");
        let e = a.post_write(&write_op(
            region,
            0,
            1,
            "shm:/ferry-no-such@1000+4096",
            0x1000,
            1,
        ));
        assert!(matches!(e, Err(ShmError::PeerGone { .. })), "{e:?}");
        assert!(a.poll_completion().is_none());
        // A peer that claims more than its object holds.
        let liar = s.replace("+1048576", "+2097152");
        let e = a.post_write(&write_op(region, 0, 1, &liar, base, 1));
        assert!(matches!(e, Err(ShmError::ShortObject { .. })), "{e:?}");
    }

    #[test]
    fn a_vanished_peer_is_reported_gone() {
        let (mut a, region, b) = pair();
        let (s, base) = (b.session_id().to_owned(), b.pool_ptr() as u64);
        a.post_write(&write_op(region, 0, 64, &s, base, 1)).unwrap();
        drop(b);
        let e = a.post_write(&write_op(region, 0, 64, &s, base, 2));
        assert!(matches!(e, Err(ShmError::PeerGone { .. })), "{e:?}");
    }

    #[test]
    fn any_number_of_regions_inside_the_pool_register_and_memory_outside_is_refused() {
        let (mut a, whole, b) = pair();
        // SAFETY: sub-ranges of `a`'s live pool (the session id names the
        // pool, so every region inside it is addressable by peers).
        let (r1, r2) = unsafe {
            (
                a.register(a.pool_ptr(), 4096).unwrap(),
                a.register(a.pool_ptr().add(8192), 4096).unwrap(),
            )
        };
        assert!(whole.id != r1.id && r1.id != r2.id);
        // SAFETY: inside `a`'s live pool.
        unsafe { std::slice::from_raw_parts_mut(a.pool_ptr().add(8192), 4096) }.fill(0x3c);
        a.post_write(&write_op(
            r2,
            0,
            4096,
            b.session_id(),
            b.pool_ptr() as u64,
            1,
        ))
        .unwrap();
        assert!(a.poll_completion().unwrap().result.is_ok());
        // SAFETY: inside `b`'s live pool, written above.
        let got = unsafe { std::slice::from_raw_parts(b.pool_ptr(), 4096) };
        assert!(got.iter().all(|&x| x == 0x3c));
        // A region's bounds hold for writes from it.
        let e = a.post_write(&write_op(
            r1,
            4000,
            200,
            b.session_id(),
            b.pool_ptr() as u64,
            2,
        ));
        assert!(e.is_err(), "{e:?}");
        a.deregister(r1).unwrap();
        assert!(a.deregister(r1).is_err());
        // Memory another process cannot map is refused.
        let mut outside = vec![0u8; 64];
        // SAFETY: registration is refused, so nothing is ever written.
        let e = unsafe { a.register(outside.as_mut_ptr(), 64) };
        assert!(matches!(e, Err(ShmError::NotShared { .. })));
    }
}
