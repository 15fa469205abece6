//! Why each thread's last transfer on an engine failed (sglang's
//! `transfer_sync` returns only a code, per call, and so its reason is per
//! call too).
//!
//! The reasons live in each thread's own storage, not in a table of the
//! engine's: they go when their thread ends, so an engine called from many
//! short-lived threads holds nothing for those that ended.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// One engine's reasons: the key each thread files its reason for this
/// engine under, which also counts the threads holding one.
#[derive(Debug, Default)]
pub(crate) struct LastErrors {
    key: Arc<Holders>,
}

/// How many threads hold a reason for the engine.
#[derive(Debug, Default)]
struct Holders(AtomicUsize);

/// A thread's reasons, one per engine whose last transfer on this thread
/// failed. Engines that were dropped since are pruned on the next failure
/// (or with the thread).
struct Reasons(Vec<(Weak<Holders>, String)>);

impl Drop for Reasons {
    fn drop(&mut self) {
        for (engine, _) in &self.0 {
            if let Some(holders) = engine.upgrade() {
                holders.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

thread_local! {
    static REASONS: RefCell<Reasons> = const { RefCell::new(Reasons(Vec::new())) };
}

impl LastErrors {
    fn is_mine(&self, engine: &Weak<Holders>) -> bool {
        std::ptr::eq(engine.as_ptr(), Arc::as_ptr(&self.key))
    }

    /// The calling thread's last transfer failed, for `reason`.
    pub(crate) fn set(&self, reason: String) {
        // Only a thread already tearing down its storage cannot keep one;
        // it makes no further call to read it.
        let _ = REASONS.try_with(|r| {
            let mut r = r.borrow_mut();
            r.0.retain(|(engine, _)| engine.strong_count() > 0);
            match r.0.iter_mut().find(|(engine, _)| self.is_mine(engine)) {
                Some((_, kept)) => *kept = reason,
                None => {
                    self.key.0.fetch_add(1, Ordering::Relaxed);
                    r.0.push((Arc::downgrade(&self.key), reason));
                }
            }
        });
    }

    /// The calling thread's last transfer succeeded.
    pub(crate) fn clear(&self) {
        let _ = REASONS.try_with(|r| {
            let mut r = r.borrow_mut();
            if let Some(i) = r.0.iter().position(|(engine, _)| self.is_mine(engine)) {
                r.0.swap_remove(i);
                self.key.0.fetch_sub(1, Ordering::Relaxed);
            }
        });
    }

    /// Why the calling thread's last transfer failed, if it did.
    pub(crate) fn get(&self) -> Option<String> {
        REASONS
            .try_with(|r| {
                r.borrow()
                    .0
                    .iter()
                    .find(|(engine, _)| self.is_mine(engine))
                    .map(|(_, reason)| reason.clone())
            })
            .ok()
            .flatten()
    }

    /// How many live threads hold a reason for this engine.
    pub(crate) fn holders(&self) -> usize {
        self.key.0.load(Ordering::Relaxed)
    }
}
