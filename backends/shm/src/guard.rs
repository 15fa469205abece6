//! Writes into a peer's pool that survive the peer shrinking it.
//!
//! A peer owns its shared-memory object and may `ftruncate` it at any
//! moment; a copy into the part of our mapping past the new end raises
//! SIGBUS, which kills the process by default. Checking the size before
//! each write leaves a window, so the mappings of peers' pools are
//! registered here, and a SIGBUS handler that finds the faulting address
//! inside one maps anonymous memory over the rest of it and marks it
//! failed: the copy runs on into memory nobody reads, and the transport
//! sees the mark when it returns and fails the write with a typed error.
//! A fault anywhere else goes to the handler that was there before (or to
//! the default action, which ends the process as it would have).
//!
//! The handler touches only atomics and makes one `mmap` system call; it
//! allocates nothing and takes no lock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Peer mappings guarded at once; past this a mapping is refused (the
/// transport treats that as a peer it cannot write to safely).
const SLOTS: usize = 256;

struct Range {
    start: AtomicUsize,
    len: AtomicUsize,
    hit: AtomicBool,
    taken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Range = Range {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
    taken: AtomicBool::new(false),
};

static RANGES: [Range; SLOTS] = [FREE; SLOTS];

/// The SIGBUS disposition found when the handler was installed.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A guarded mapping; unguarded when dropped.
#[derive(Debug)]
pub(crate) struct Guard {
    slot: usize,
}

impl Guard {
    /// Guards `len` bytes mapped at `start`, installing the handler on
    /// first use; `None` if every slot is taken or the handler cannot be
    /// installed.
    pub(crate) fn new(start: *mut u8, len: usize) -> Option<Self> {
        install()?;
        let slot = RANGES.iter().position(|r| {
            r.taken
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })?;
        let r = &RANGES[slot];
        r.hit.store(false, Ordering::Release);
        r.start.store(start as usize, Ordering::Release);
        r.len.store(len, Ordering::Release);
        Some(Self { slot })
    }

    /// True (once) if a copy faulted in the mapping since the last call:
    /// its object shrank, and part of the mapping is now anonymous memory.
    pub(crate) fn take_fault(&self) -> bool {
        RANGES[self.slot].hit.swap(false, Ordering::AcqRel)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let r = &RANGES[self.slot];
        r.len.store(0, Ordering::Release);
        r.start.store(0, Ordering::Release);
        r.taken.store(false, Ordering::Release);
    }
}

fn install() -> Option<()> {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    let ok = *INSTALLED.get_or_init(|| {
        // SAFETY: sigaction is plain old data; all-zero is a valid value,
        // and the fields set below make it a valid SA_SIGINFO handler.
        let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
        // SAFETY: the mask is a valid sigset_t owned by `new`.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
        // SAFETY: as above.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both structures are valid for the call; SIGBUS is a
        // valid signal to handle.
        if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } != 0 {
            return false;
        }
        let _ = PREVIOUS.set(old);
        true
    });
    ok.then_some(())
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in &RANGES {
        let len = r.len.load(Ordering::Acquire);
        let start = r.start.load(Ordering::Acquire);
        if len == 0 || addr < start || addr >= start + len {
            continue;
        }
        let page = addr & !(4096 - 1);
        // SAFETY: [page, start + len) lies inside a live mapping that the
        // transport registered and keeps until the copy returns; replacing
        // it with private anonymous memory (MAP_FIXED) only changes where
        // the rest of this copy lands. mmap is a plain system call here.
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                start + len - page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            r.hit.store(true, Ordering::Release);
            return;
        }
    }
    // Not a peer's pool: what would have happened without us.
    match PREVIOUS.get() {
        Some(old) if old.sa_flags & libc::SA_SIGINFO != 0 && old.sa_sigaction > 1 => {
            // SAFETY: the previous handler was installed for SA_SIGINFO
            // with this signature.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig, info, ctx);
        }
        Some(old) if old.sa_sigaction > 1 => {
            // SAFETY: a plain handler of the C signature.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
            f(sig);
        }
        _ => {
            // SAFETY: restoring the default action; returning re-executes
            // the faulting access, which now ends the process as SIGBUS
            // always did.
            unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_into_a_shrunk_object_is_caught_and_marked() {
        let len = 16 * 4096;
        let pool = crate::pool::ShmPool::create(len).unwrap();
        let peer = crate::pool::ShmPool::open(pool.name(), len).unwrap();
        let guard = Guard::new(peer.as_ptr(), peer.len()).unwrap();
        // The owner shrinks its object to one page under the mapping.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/dev/shm{}", pool.name()))
            .unwrap();
        f.set_len(4096).unwrap();
        let src = vec![9u8; len];
        // SAFETY: both ranges are `len` bytes of live mappings; the part of
        // the destination past the object's end is what the guard catches.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), peer.as_ptr(), len) };
        assert!(guard.take_fault());
        assert!(!guard.take_fault());
        // The first page is still the object's, and holds the copy.
        // SAFETY: the first page of the owner's live mapping.
        let first = unsafe { std::slice::from_raw_parts(pool.as_ptr(), 4096) };
        assert!(first.iter().all(|&b| b == 9));
    }
}
