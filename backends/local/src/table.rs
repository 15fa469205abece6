//! The region table an engine publishes: which ranges of its address space
//! peers may write and read, in a sealed `memfd` that peers map. (Below,
//! a "writer" is a peer copying into or out of the owner's memory: a
//! one-sided read counts in exactly as a write does.)
//!
//! The owner rewrites the table under a sequence lock; writers read it
//! without a lock and retry when the sequence moved. Writers also count
//! themselves in before they read it and out after their copy, so that an
//! owner that removed a region and then sees every count at zero knows no
//! write into the region, nor read from it, is still running (the two
//! sides meet through sequentially consistent fences, Dekker's pattern).
//!
//! Each writer counts in a place of its own, named by its process id (a
//! lease, taken when it attaches and given back when it lets go), so that
//! an owner can tell a writer that died mid-copy (its count never comes
//! down, but a process that has exited copies nothing) from one that is
//! only slow or stopped, which it must wait for. A place is one word, the
//! process id above its count, so that the owner gives a dead writer's
//! place back only if the word is still what it judged (a compare and
//! swap): never a place a new writer took meanwhile, nor a count it added.
//! Beside it the writer's start time tells a process id the kernel gave
//! to another process since from the writer itself. Writers past
//! [`MAX_WRITERS`] count in a shared place, whose dead cannot be told
//! apart.
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

/// Writers that count in a place of their own.
const MAX_WRITERS: usize = 64;

const MAGIC: u64 = u64::from_le_bytes(*b"FERRYLCL");
const VERSION: u32 = 3;

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
    /// Writers' leases: each place's holder (its process id, the upper 32
    /// bits; 0: free) and how many copies it has inside (the lower 32).
    writers: [AtomicU64; MAX_WRITERS],
    /// When each place's holder started (clock ticks after boot, as
    /// `/proc/<pid>/stat` says; 0: unknown), written before it first
    /// counts in.
    writer_start: [AtomicU64; MAX_WRITERS],
}

/// A place's word held by `pid` with nothing inside.
fn held_by(pid: u32) -> u64 {
    u64::from(pid) << 32
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
            return Err(
                "its table descriptor does not hold a ferry region table (v3: both engines must be this version of ferry)"
                    .into(),
            );
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

    /// Who is inside the table: nobody (`Quiet`: every write that could
    /// have seen a region removed before this call has finished), or the
    /// writers still copying. Places of writers whose process has exited
    /// are given back first: a process that has exited copies nothing.
    pub(crate) fn inside(&self) -> Occupancy {
        fence(Ordering::SeqCst);
        let h = self.header();
        let mut live = Vec::new();
        for (place, started) in h.writers.iter().zip(&h.writer_start) {
            let word = place.load(Ordering::SeqCst);
            let (pid, copies) = ((word >> 32) as u32, word as u32);
            if pid == 0 || copies == 0 {
                continue;
            }
            // Given back only if the word is still the one judged: a dead
            // writer changes it no more, so a change is a live one's.
            if gone(pid, started.load(Ordering::SeqCst))
                && place
                    .compare_exchange(word, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                continue;
            }
            live.push(pid);
        }
        let shared = h.inflight.load(Ordering::SeqCst);
        if live.is_empty() && shared == 0 {
            Occupancy::Quiet
        } else {
            Occupancy::Writers {
                pids: live,
                unnamed: shared,
            }
        }
    }

    /// A place of this process's own to count its copies in (see the
    /// module's documentation); `None` when every place is taken (its
    /// copies then count in the shared one).
    pub(crate) fn lease(&self) -> Option<Lease> {
        let me = std::process::id();
        let h = self.header();
        let place = (0..MAX_WRITERS).find(|&i| {
            h.writers[i]
                .compare_exchange(0, held_by(me), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })?;
        // Before the first copy counts in: an owner reads it only of a
        // place with copies inside.
        h.writer_start[place].store(start_time(me).unwrap_or(0), Ordering::SeqCst);
        Some(Lease { place })
    }

    /// Gives `lease` back (its holder has no copy inside). Only the word
    /// its holder left: never one an owner gave to another writer.
    pub(crate) fn release(&self, lease: Lease) {
        let h = self.header();
        let me = held_by(std::process::id());
        let _ = h.writers[lease.place].compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Counts a writer in, in its `lease`'s place (or the shared one); it
    /// is counted out when the guard drops.
    pub(crate) fn enter(&self, lease: Option<&Lease>) -> Inside<'_> {
        let h = self.header();
        // A place's count is its word's lower half: one more copy is one
        // more in the word.
        let count = match lease {
            Some(l) => &h.writers[l.place],
            None => &h.inflight,
        };
        count.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Inside { count }
    }
}

/// Who is inside a table ([`Table::inside`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Occupancy {
    /// Nobody.
    Quiet,
    /// Writers still copying: the processes of those with a place of
    /// their own, and how many counted in the shared place.
    Writers {
        /// Their process ids.
        pids: Vec<u32>,
        /// Copies counted in the shared place.
        unnamed: u64,
    },
}

/// True if the writer `pid`, started at `started` (0: unknown), copies
/// nothing any more: it has exited, or its pid now names a process that
/// started at another time.
fn gone(pid: u32, started: u64) -> bool {
    exited(pid) || (started != 0 && start_time(pid).is_some_and(|now| now != started))
}

/// When process `pid` started, in clock ticks after boot (`/proc/<pid>/stat`'s
/// 22nd field), or `None` if it cannot be read (the process is gone).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything;
    // the fields after its last `)` start at the third.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// True if the process `pid` has exited (it is gone, or a zombie whose
/// threads have all ended).
fn exited(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: pidfd_open takes a pid and flags, and returns a new
    // descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // SAFETY: a descriptor just returned to us and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, no wait. A pidfd is readable once its
    // process has exited.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// A writer's place of its own in a peer's table ([`Table::lease`]).
#[derive(Debug)]
pub(crate) struct Lease {
    place: usize,
}

/// A writer counted in a peer's table: while it lives, the peer waits
/// before it reuses memory it deregistered.
pub(crate) struct Inside<'t> {
    count: &'t AtomicU64,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a writer found in a table.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Every range lies inside a region.
    Inside,
    /// This range lies outside every region; the table held `regions`.
    Outside {
        /// The range's first byte.
        addr: u64,
        /// Its length.
        len: u64,
        /// How many regions the table held.
        regions: usize,
    },
    /// The owner closed its engine.
    Closed,
    /// The table kept changing.
    Busy,
}

impl Table {
    /// Checks, for a writer counted in (`_inside`), that every
    /// `(addr, len)` of `ranges` lies inside one region.
    pub(crate) fn check<I>(&self, _inside: &Inside<'_>, ranges: I) -> Lookup
    where
        I: Iterator<Item = (u64, u64)> + Clone,
    {
        let h = self.header();
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
                (false, Some((addr, len))) => Lookup::Outside {
                    addr,
                    len,
                    regions: n,
                },
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
        let lease = peer.lease().expect("a free place");
        {
            let w = peer.enter(Some(&lease));
            let me = std::process::id();
            assert_eq!(
                table.inside(),
                Occupancy::Writers {
                    pids: vec![me],
                    unnamed: 0
                }
            );
            let ranges = [(0x1000, 0x100), (0x5008, 8)];
            assert_eq!(peer.check(&w, ranges.iter().copied()), Lookup::Inside);
            let ranges = [(0x1000, 0x101)];
            assert_eq!(
                peer.check(&w, ranges.iter().copied()),
                Lookup::Outside {
                    addr: 0x1000,
                    len: 0x101,
                    regions: 2
                }
            );
            let ranges = [(u64::MAX - 1, 4)];
            assert_eq!(
                peer.check(&w, ranges.iter().copied()),
                Lookup::Outside {
                    addr: u64::MAX - 1,
                    len: 4,
                    regions: 2
                }
            );
            // Without a place of its own, a writer counts in the shared one.
            let unnamed = peer.enter(None);
            assert_eq!(
                table.inside(),
                Occupancy::Writers {
                    pids: vec![me],
                    unnamed: 1
                }
            );
            drop(unnamed);
        }
        assert_eq!(table.inside(), Occupancy::Quiet);
        peer.release(lease);
        table.close();
        let w = peer.enter(None);
        assert_eq!(peer.check(&w, [(0x1000, 1)].into_iter()), Lookup::Closed);
    }

    #[test]
    fn a_writer_that_died_inside_is_not_waited_for_and_its_place_comes_back() {
        let (table, fd) = Table::create(9).unwrap();
        let peer = Table::attach(&fd, 9).unwrap();
        // A child process stands for a writer that died mid-copy: its
        // place holds its pid and a count that never comes down.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let h = peer.header();
        h.writers[3].store(held_by(pid) | 1, Ordering::SeqCst);
        // A live writer (this process) is waited for; the dead one is not.
        let lease = peer.lease().unwrap();
        let w = peer.enter(Some(&lease));
        assert_eq!(
            table.inside(),
            Occupancy::Writers {
                pids: vec![std::process::id()],
                unnamed: 0
            }
        );
        assert_eq!(h.writers[3].load(Ordering::SeqCst), 0, "given back");
        drop(w);
        assert_eq!(table.inside(), Occupancy::Quiet);
        peer.release(lease);
        // Every place is free again.
        assert!(h.writers.iter().all(|p| p.load(Ordering::SeqCst) == 0));
    }

    #[test]
    fn a_writer_whose_pid_names_another_process_now_is_not_waited_for() {
        let (table, fd) = Table::create(10).unwrap();
        let peer = Table::attach(&fd, 10).unwrap();
        // A place held under this (live) process's pid, but by a writer
        // that started at another time: the pid was given to another
        // process since.
        let me = std::process::id();
        let started = start_time(me).expect("this process's start time");
        assert!(started > 0);
        let h = peer.header();
        h.writers[5].store(held_by(me) | 2, Ordering::SeqCst);
        h.writer_start[5].store(started + 1, Ordering::SeqCst);
        assert_eq!(table.inside(), Occupancy::Quiet);
        assert_eq!(h.writers[5].load(Ordering::SeqCst), 0, "given back");
        // The same pid with its own start time is waited for.
        h.writers[5].store(held_by(me) | 1, Ordering::SeqCst);
        h.writer_start[5].store(started, Ordering::SeqCst);
        assert_eq!(
            table.inside(),
            Occupancy::Writers {
                pids: vec![me],
                unnamed: 0
            }
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
