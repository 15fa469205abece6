//! Large copies split across a few persistent threads.
//!
//! One core rarely saturates memory bandwidth with a single `memcpy`; two
//! or more usually come closer. Threads are started once (spawning per
//! write would cost more than small writes take, and allocate), and the
//! caller copies one part itself.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

#[derive(Clone, Copy, Debug)]
struct Job {
    dst: usize,
    src: usize,
    len: usize,
}

#[derive(Debug, Default)]
struct State {
    jobs: Vec<Option<Job>>,
    pending: usize,
    stop: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker never panics while holding the lock; if one did, the
        // state is still consistent (plain counters).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Splits copies of at least `threshold` bytes across `threads` threads
/// (the caller's included).
#[derive(Debug)]
pub struct Copier {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threshold: usize,
}

/// Parts are page multiples, so that no two threads write one page.
const PAGE: usize = 4096;

impl Copier {
    /// A copier using `threads` threads in all (1: the caller alone) for
    /// copies of `threshold` bytes or more. Threads that cannot be started
    /// are done without.
    pub fn new(threads: usize, threshold: usize) -> Self {
        let shared = Arc::new(Shared::default());
        let mut workers = Vec::new();
        for me in 0..threads.saturating_sub(1) {
            let s = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("ferry-copy-{me}"))
                .spawn(move || worker(&s, me));
            match spawned {
                Ok(h) => workers.push(h),
                Err(_) => break,
            }
        }
        shared.lock().jobs = vec![None; workers.len()];
        Self {
            shared,
            workers,
            threshold: threshold.max(PAGE),
        }
    }

    /// Threads used for a large copy, the caller's included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Copies `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes
    /// until this returns, and the two ranges must not overlap.
    pub unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        let parts = if len >= self.threshold {
            self.workers.len() + 1
        } else {
            1
        };
        let part = len.div_ceil(parts).div_ceil(PAGE) * PAGE;
        let mut state = self.shared.lock();
        let mut start = part.min(len);
        for job in state.jobs.iter_mut().take(parts - 1) {
            if start >= len {
                break;
            }
            let n = part.min(len - start);
            *job = Some(Job {
                dst: dst as usize + start,
                src: src as usize + start,
                len: n,
            });
            start += n;
        }
        state.pending = state.jobs.iter().flatten().count();
        let waiting = state.pending > 0;
        drop(state);
        if waiting {
            self.shared.work.notify_all();
        }
        // SAFETY: the caller's contract covers [0, len); this is its first
        // part, disjoint from the workers' parts.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, part.min(len)) };
        let mut state = self.shared.lock();
        while state.pending > 0 {
            state = self
                .shared
                .done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

fn worker(shared: &Shared, me: usize) {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        let Some(job) = state.jobs.get_mut(me).and_then(Option::take) else {
            state = shared
                .work
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        drop(state);
        // SAFETY: `Copier::copy` handed out this part of a range its caller
        // vouched for, and waits for `pending` to reach zero before it
        // returns, so the memory outlives the copy.
        unsafe { std::ptr::copy_nonoverlapping(job.src as *const u8, job.dst as *mut u8, job.len) };
        state = shared.lock();
        state.pending -= 1;
        if state.pending == 0 {
            shared.done.notify_all();
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
    use super::*;

    #[test]
    fn every_byte_lands_for_every_split() {
        let mut c = Copier::new(3, 4096);
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
            assert_eq!(dst, src, "len {len}");
        }
    }
}
