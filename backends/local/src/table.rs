//! The region table an engine publishes: which ranges of its address space
//! peers may write and read, in a sealed `memfd` that peers map. (Below,
//! a "writer" is a peer copying into or out of the owner's memory: a
//! one-sided read counts in exactly as a write does.)
//!
//! The owner rewrites the table under a sequence lock; writers read it
//! without a lock and retry when the sequence moved. Writers also count
//! themselves in (`inflight`) before they read it and out after their
//! copy, so that an owner that removed a region and then sees the count
//! at zero knows no write into the region, nor read from it, is still
//! running (the two sides meet through sequentially consistent fences,
//! Dekker's pattern).
//!
//! The memfd is sealed against shrinking and growing before its number is
//! advertised, so a peer's table can never be truncated under a reader
//! (which would raise SIGBUS); an attaching writer checks the seals.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::error::LocalError;

/// Regions one table holds.
pub const MAX_REGIONS: usize = 256;

const MAGIC: u64 = u64::from_le_bytes(*b"FERRYLCL");
const VERSION: u32 = 1;

/// How many times a reader retries a table that keeps changing.
const READ_TRIES: u32 = 10_000;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    max_regions: AtomicU32,
    nonce: AtomicU64,
    seq: AtomicU64,
    inflight: AtomicU64,
    closed: AtomicU32,
    count: AtomicU32,
    regions: [[AtomicU64; 2]; MAX_REGIONS],
}

/// Bytes a table takes (whole pages).
fn table_len() -> usize {
    let page = page_size();
    core::mem::size_of::<Header>().div_ceil(page) * page
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|p| *p > 0).unwrap_or(4096)
}

fn sys(call: &'static str) -> LocalError {
    LocalError::Sys {
        call,
        source: io::Error::last_os_error(),
    }
}

/// A mapped table: this engine's own, or a peer's.
#[derive(Debug)]
pub(crate) struct Table {
    map: NonNull<Header>,
    len: usize,
}

// SAFETY: the mapping is shared memory whose every field is an atomic; it
// is unmapped only on drop, when no reference to it is left.
unsafe impl Send for Table {}
// SAFETY: as above: all access goes through atomics.
unsafe impl Sync for Table {}

impl Drop for Table {
    fn drop(&mut self) {
        // SAFETY: `map` and `len` are the mapping made in `map_fd`, and no
        // reference into it outlives `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.len) };
    }
}

impl Table {
    /// Makes this engine's table, empty, with `nonce`; returns it and its
    /// descriptor (which must stay open while peers may attach).
    pub(crate) fn create(nonce: u64) -> Result<(Self, OwnedFd), LocalError> {
        let len = table_len();
        // SAFETY: the name is a NUL-terminated literal.
        let raw = unsafe {
            libc::memfd_create(
                c"ferry-local-regions".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(sys("memfd_create"));
        }
        // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain calls on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(sys("ftruncate"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(sys("fcntl(F_ADD_SEALS)"));
        }
        let table = Self::map_fd(&fd, len)?;
        let h = table.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.max_regions.store(MAX_REGIONS as u32, Ordering::Relaxed);
        h.nonce.store(nonce, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok((table, fd))
    }

    /// Maps a peer's table from its descriptor, after checking that it is
    /// sealed against shrinking, large enough, and a table with `nonce`.
    /// `Err(why)` says what it is instead.
    pub(crate) fn attach(fd: &OwnedFd, nonce: u64) -> Result<Self, String> {
        let len = table_len();
        // SAFETY: fstat fills the struct we own.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(format!(
                "fstat of its table: {}",
                io::Error::last_os_error()
            ));
        }
        if (st.st_size as u64) < len as u64 {
            return Err(format!(
                "its table descriptor holds {} bytes, not a region table",
                st.st_size
            ));
        }
        // SAFETY: a plain query on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err("its table descriptor is not sealed against shrinking".into());
        }
        let table = Self::map_fd(fd, len).map_err(|e| e.to_string())?;
        let h = table.header();
        if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION
        {
            return Err("its table descriptor does not hold a ferry region table (v1)".into());
        }
        if h.nonce.load(Ordering::Relaxed) != nonce {
            return Err(
                "its table has another nonce: the engine that session named is gone".into(),
            );
        }
        Ok(table)
    }

    fn map_fd(fd: &OwnedFd, len: usize) -> Result<Self, LocalError> {
        // SAFETY: a fresh shared mapping of `len` bytes of a descriptor
        // that holds at least that many (checked or sized by the caller).
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mmap"));
        }
        let map = NonNull::new(p.cast::<Header>()).ok_or_else(|| sys("mmap"))?;
        Ok(Self { map, len })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least one `Header` long, page-aligned,
        // lives as long as `self`, and holds only atomics (any bit pattern
        // is valid, and shared mutation goes through them).
        unsafe { self.map.as_ref() }
    }

    /// Publishes `regions` (`(base, len)`) as the table's contents.
    pub(crate) fn publish(&self, regions: &[(u64, u64)]) {
        let h = self.header();
        let s = h.seq.load(Ordering::Relaxed);
        h.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (slot, (base, len)) in h.regions.iter().zip(regions) {
            slot[0].store(*base, Ordering::Relaxed);
            slot[1].store(*len, Ordering::Relaxed);
        }
        h.count
            .store(regions.len().min(MAX_REGIONS) as u32, Ordering::Relaxed);
        h.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Marks the table closed: writers that see it stop writing.
    pub(crate) fn close(&self) {
        self.header().closed.store(1, Ordering::Release);
        self.publish(&[]);
    }

    /// True once no writer is inside the table: every write that could
    /// have seen a region removed before this call has finished.
    pub(crate) fn quiescent(&self) -> bool {
        fence(Ordering::SeqCst);
        self.header().inflight.load(Ordering::SeqCst) == 0
    }

    /// Counts a writer in; it is counted out when the guard drops.
    pub(crate) fn enter(&self) -> Inside<'_> {
        self.header().inflight.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Inside { table: self }
    }
}

/// A writer counted in a peer's table: while it lives, the peer waits
/// before it reuses memory it deregistered.
pub(crate) struct Inside<'t> {
    table: &'t Table,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.table.header().inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a writer found in a table.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Every range lies inside a region.
    Inside,
    /// This range lies outside every region.
    Outside(u64, u64),
    /// The owner closed its engine.
    Closed,
    /// The table kept changing.
    Busy,
}

impl Inside<'_> {
    /// Checks that every `(addr, len)` of `ranges` lies inside one region.
    pub(crate) fn check<I>(&self, ranges: I) -> Lookup
    where
        I: Iterator<Item = (u64, u64)> + Clone,
    {
        let h = self.table.header();
        for _ in 0..READ_TRIES {
            let s1 = h.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                core::hint::spin_loop();
                continue;
            }
            let closed = h.closed.load(Ordering::Relaxed) != 0;
            let n = (h.count.load(Ordering::Relaxed) as usize).min(MAX_REGIONS);
            let mut miss = None;
            for (addr, len) in ranges.clone() {
                let found = h.regions[..n].iter().any(|r| {
                    let base = r[0].load(Ordering::Relaxed);
                    let rlen = r[1].load(Ordering::Relaxed);
                    addr >= base
                        && addr
                            .checked_add(len)
                            .zip(base.checked_add(rlen))
                            .is_some_and(|(end, rend)| end <= rend)
                });
                if !found {
                    miss = Some((addr, len));
                    break;
                }
            }
            fence(Ordering::Acquire);
            if h.seq.load(Ordering::Relaxed) != s1 {
                continue;
            }
            return match (closed, miss) {
                (true, _) => Lookup::Closed,
                (false, Some((a, l))) => Lookup::Outside(a, l),
                (false, None) => Lookup::Inside,
            };
        }
        Lookup::Busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_answers_what_it_holds_and_counts_writers() {
        let (table, fd) = Table::create(7).unwrap();
        let peer = Table::attach(&fd, 7).unwrap();
        assert!(Table::attach(&fd, 8).unwrap_err().contains("another nonce"));
        table.publish(&[(0x1000, 0x100), (0x5000, 0x10)]);
        {
            let w = peer.enter();
            assert!(!table.quiescent());
            let ranges = [(0x1000, 0x100), (0x5008, 8)];
            assert_eq!(w.check(ranges.iter().copied()), Lookup::Inside);
            let ranges = [(0x1000, 0x101)];
            assert_eq!(
                w.check(ranges.iter().copied()),
                Lookup::Outside(0x1000, 0x101)
            );
            let ranges = [(u64::MAX - 1, 4)];
            assert_eq!(
                w.check(ranges.iter().copied()),
                Lookup::Outside(u64::MAX - 1, 4)
            );
        }
        assert!(table.quiescent());
        table.close();
        assert_eq!(
            peer.enter().check([(0x1000, 1)].into_iter()),
            Lookup::Closed
        );
    }

    #[test]
    fn an_unsealed_or_foreign_descriptor_is_refused() {
        // SAFETY: a plain memfd, owned below.
        let raw = unsafe { libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our own descriptor.
        assert_eq!(unsafe { libc::ftruncate(raw, 1 << 20) }, 0);
        let e = Table::attach(&fd, 1).err().unwrap();
        assert!(e.contains("not sealed"), "{e}");
    }
}
