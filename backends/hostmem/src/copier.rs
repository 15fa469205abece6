//! The one parallel copier of ferry's host-side data planes.
//!
//! One core rarely saturates memory bandwidth with a single copy (a
//! `memcpy`, or the kernel's copy in `process_vm_writev`); two or more
//! usually come closer. The shared-memory data plane splits a large
//! `memcpy` over a copier's threads, and the same-host (cross-memory
//! attach) data plane its writes' 4 MiB pieces. The threads are started
//! once (spawning per write would cost more than small writes take) and
//! the caller works too, claiming parts as the threads do.
//!
//! Hand-written rather than a rayon pool: a hand-off through the
//! shared-memory plane allocates nothing in steady state (a test counts),
//! and rayon's injector allocates a block for every 63 jobs handed to it
//! from outside its pool. This one keeps its one job in place and
//! allocates nothing per copy.
// The copy threads run a closure the caller borrows; only the caller's
// wait for every part makes that sound, which safe code cannot say.
#![allow(unsafe_code)]

use std::io;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Parts of a split copy are page multiples, so that no two threads write
/// one page.
const PAGE: usize = 4096;

/// Work borrowed from a caller of [`Copier::run`] who waits until it is
/// done: `'static` only in name (see `run`).
type Work = &'static (dyn Fn(usize) + Sync);

/// The one job being shared: parts `0..parts` of `work`.
struct Job {
    work: Work,
    parts: usize,
    /// The next part nobody has claimed.
    next: usize,
    /// Parts finished (whether or not they panicked).
    done: usize,
    panicked: bool,
}

#[derive(Default)]
struct State {
    job: Option<Job>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Parts run outside the lock, under `catch_unwind`; nothing
        // panics while holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims the next part of the job, if one is left.
    fn claim(state: &mut State) -> Option<(Work, usize)> {
        let job = state.job.as_mut()?;
        if job.next == job.parts {
            return None;
        }
        job.next += 1;
        Some((job.work, job.next - 1))
    }

    /// Runs part `i` and counts it done.
    fn run_part<'a>(&'a self, work: Work, i: usize) -> MutexGuard<'a, State> {
        let ok = catch_unwind(AssertUnwindSafe(|| work(i))).is_ok();
        let mut state = self.lock();
        if let Some(job) = state.job.as_mut() {
            job.done += 1;
            job.panicked |= !ok;
            if job.done == job.parts {
                self.done.notify_all();
            }
        }
        state
    }
}

/// A few persistent threads that share large copies with their caller
/// (see the module's documentation).
pub struct Copier {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    split_at: usize,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("threads", &self.threads())
            .field("split_at", &self.split_at)
            .finish()
    }
}

impl Copier {
    /// A copier that uses `threads` threads in all, the caller's included
    /// (0 or 1: the caller's alone), named `name-N`, and splits copies of
    /// `split_at` bytes or more (at least a page). Fails if a thread
    /// cannot be started.
    pub fn new(threads: usize, split_at: usize, name: &str) -> io::Result<Self> {
        let mut copier = Self {
            shared: Arc::new(Shared::default()),
            workers: Vec::new(),
            split_at: split_at.max(PAGE),
        };
        for me in 0..threads.saturating_sub(1) {
            let s = Arc::clone(&copier.shared);
            let worker = std::thread::Builder::new()
                .name(format!("{name}-{me}"))
                .spawn(move || serve(&s))?;
            // Pushed at once: if a later one fails, the drop stops these.
            copier.workers.push(worker);
        }
        Ok(copier)
    }

    /// Threads a large copy uses, the caller's included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// True if a copy of `len` bytes is split over the threads.
    pub fn splits(&self, len: u64) -> bool {
        !self.workers.is_empty() && len >= self.split_at as u64
    }

    /// Calls `work(i)` for every `i` in `0..parts`, on the caller's thread
    /// and the copier's, and returns when every call has returned. While
    /// another caller's job has the threads, the caller runs its parts
    /// alone. A part that panics is counted done, and the panic goes on
    /// in the caller once every part has ended.
    pub fn run(&self, parts: usize, work: &(dyn Fn(usize) + Sync)) {
        if parts <= 1 || self.workers.is_empty() {
            (0..parts).for_each(work);
            return;
        }
        let mut state = self.shared.lock();
        if state.job.is_some() {
            drop(state);
            (0..parts).for_each(work);
            return;
        }
        // SAFETY: the copier's threads call `work` only while this job is
        // in `state.job`, and this function takes it out (below) only
        // once `done == parts`, i.e. after every call of it has returned,
        // panicking or not: the borrow outlives every use.
        let erased: Work = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(work)
        };
        state.job = Some(Job {
            work: erased,
            parts,
            next: 0,
            done: 0,
            panicked: false,
        });
        self.shared.work.notify_all();
        while let Some((w, i)) = Shared::claim(&mut state) {
            drop(state);
            state = self.shared.run_part(w, i);
        }
        while state.job.as_ref().is_some_and(|j| j.done < j.parts) {
            state = self
                .shared
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let panicked = state.job.take().is_some_and(|j| j.panicked);
        drop(state);
        if panicked {
            resume_unwind(Box::new("a part of a copier's job panicked"));
        }
    }

    /// Calls `f` on every part, spread over the threads, and returns the
    /// first error (parts not begun by then are skipped).
    pub fn try_each<T, E, F>(&self, parts: &[T], f: F) -> Result<(), E>
    where
        T: Sync,
        E: Send,
        F: Fn(&T) -> Result<(), E> + Sync,
    {
        let first: Mutex<Option<E>> = Mutex::new(None);
        let failed = std::sync::atomic::AtomicBool::new(false);
        self.run(parts.len(), &|i| {
            if failed.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            if let Err(e) = f(&parts[i]) {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                first
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_or_insert(e);
            }
        });
        match first.into_inner().unwrap_or_else(PoisonError::into_inner) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Copies `len` bytes from `src` to `dst`, split over the threads in
    /// page-multiple parts when `len` is at least the split size.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes
    /// until this returns, and the two ranges must not overlap.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        let parts = if self.splits(len as u64) {
            self.threads()
        } else {
            1
        };
        let part = len.div_ceil(parts).div_ceil(PAGE) * PAGE;
        if parts <= 1 || part >= len {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            return;
        }
        let (dst, src) = (dst as usize, src as usize);
        self.run(len.div_ceil(part), &|i| {
            let start = i * part;
            let n = part.min(len - start);
            // SAFETY: [start, start + n) lies in [0, len), which the
            // caller's contract covers; parts are disjoint, and `run`
            // returns only when every part is copied.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src + start) as *const u8,
                    (dst + start) as *mut u8,
                    n,
                )
            };
        });
    }
}

/// A copy thread: helps with the job while it has unclaimed parts.
fn serve(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        match Shared::claim(&mut state) {
            Some((w, i)) => {
                drop(state);
                state = shared.run_part(w, i);
            }
            None => {
                state = shared
                    .work
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn every_byte_lands_for_every_split() {
        for threads in [1, 3] {
            let c = Copier::new(threads, 4096, "test-copy").unwrap();
            assert_eq!(c.threads(), threads);
            for len in [
                0,
                1,
                4095,
                4096,
                4097,
                3 * 4096 + 5,
                1 << 20,
                (1 << 20) + 77,
            ] {
                let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
                let mut dst = vec![0u8; len];
                // SAFETY: both vectors hold len bytes and are distinct.
                unsafe { c.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
                assert_eq!(dst, src, "threads {threads}, len {len}");
            }
        }
    }

    #[test]
    fn every_part_runs_once_and_the_first_error_is_returned() {
        let c = Copier::new(3, 4096, "test-copy").unwrap();
        let calls: Vec<AtomicUsize> = (0..257).map(|_| AtomicUsize::new(0)).collect();
        c.run(calls.len(), &|i| {
            calls[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(calls.iter().all(|n| n.load(Ordering::Relaxed) == 1));
        let parts: Vec<u32> = (0..64).collect();
        assert_eq!(
            c.try_each(&parts, |&p| if p == 40 { Err(p) } else { Ok(()) }),
            Err(40)
        );
        assert_eq!(c.try_each(&parts, |_| Ok::<(), ()>(())), Ok(()));
    }

    #[test]
    fn callers_at_once_each_finish_their_own_job() {
        let c = Copier::new(2, 4096, "test-copy").unwrap();
        std::thread::scope(|s| {
            for t in 0..4usize {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        c.run(16, &|i| {
                            sum.fetch_add(i + t, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 120 + 16 * t);
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_part_reaches_the_caller_after_the_others_end() {
        let c = Copier::new(3, 4096, "test-copy").unwrap();
        let ran = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            c.run(32, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert_ne!(i, 7, "part 7 fails");
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::Relaxed), 32);
        // The copier still works.
        let n = AtomicUsize::new(0);
        c.run(8, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }
}
