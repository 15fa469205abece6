//! A transport that passes every call on to a real one once a test's
//! hooks have seen it: a test watches what a node or an engine asks of
//! its data plane, or disturbs it, without writing the whole trait out.

use tensorferry::core::transport::{
    Capabilities, Completion, FaultKind, Landed, PoolOwner, ReadOp, Region, Transport, WriteOp,
};

/// What a test does before a [`Hooked`] transport passes a call on; each
/// does nothing unless the test says otherwise.
pub trait Hooks<T> {
    /// Before `addr..addr + len` is registered.
    fn registering(&mut self, _addr: *mut u8, _len: usize) {}
    /// Before a write is posted.
    fn writing(&mut self, _inner: &T) {}
    /// Before a read is posted.
    fn reading(&mut self, _inner: &T) {}
    /// Before completions are polled.
    fn polling(&mut self, _inner: &T) {}
}

/// `inner`, with `hooks` before its calls.
pub struct Hooked<T, H> {
    /// Dropped before the transport, as a wrapper's own `Drop` runs
    /// before the transport it holds is dropped.
    pub hooks: H,
    /// The transport every call is passed on to.
    pub inner: T,
}

impl<T: Transport, H: Hooks<T>> Transport for Hooked<T, H> {
    type Error = T::Error;

    fn fault_kind(error: &T::Error) -> FaultKind {
        T::fault_kind(error)
    }

    fn session_id(&self) -> &str {
        self.inner.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, T::Error> {
        self.hooks.registering(addr, len);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.inner.register(addr, len) }
    }

    fn deregister(&mut self, region: Region) -> Result<(), T::Error> {
        self.inner.deregister(region)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), T::Error> {
        self.hooks.writing(&self.inner);
        self.inner.post_write(write)
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), T::Error> {
        self.hooks.reading(&self.inner);
        self.inner.post_read(read)
    }

    fn poll_completion(&mut self) -> Option<Completion<T::Error>> {
        self.hooks.polling(&self.inner);
        self.inner.poll_completion()
    }

    fn cancel_transfers(&mut self, session: &str) -> Result<(), T::Error> {
        self.inner.cancel_transfers(session)
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        self.inner.poll_landed()
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.wake_fd()
    }
}

// SAFETY: the wrapper owns the transport it forwards to and never moves it
// out or unmaps anything, so `T`'s promise holds while the wrapper lives.
unsafe impl<T: PoolOwner, H> PoolOwner for Hooked<T, H> {
    fn pool_ptr(&self) -> *mut u8 {
        self.inner.pool_ptr()
    }

    fn pool_len(&self) -> usize {
        self.inner.pool_len()
    }
}
