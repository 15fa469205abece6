//! Any data plane's transport behind one type, for callers that wrap the
//! transport a [`DataPlane`](super::DataPlane) opens without naming it
//! (the fault injector of the tests).
#![allow(unsafe_code)]

use std::os::fd::RawFd;

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, Landed, ReadOp, Region, Transport, WriteOp,
};

use tensorferry_core::transport::PoolOwner;

/// A failure of the transport inside an [`AnyTransport`]: its kind, and
/// the transport's own error.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct AnyTransportError {
    kind: FaultKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl AnyTransportError {
    /// An error of the transport `T`, of the kind `T` says it is.
    fn of<T>(e: T::Error) -> Self
    where
        T: Transport,
        T::Error: Send + Sync + 'static,
    {
        Self {
            kind: T::fault_kind(&e),
            source: Box::new(e),
        }
    }

    /// What kind of failure this is, as the transport inside said.
    pub fn kind(&self) -> FaultKind {
        self.kind
    }
}

/// The transport's side of [`AnyTransport`], object-safe: errors boxed
/// (only failures allocate).
trait Erased: Send {
    fn session_id(&self) -> &str;
    fn capabilities(&self) -> Capabilities;
    /// # Safety
    /// As [`Transport::register`].
    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, AnyTransportError>;
    fn deregister(&mut self, region: Region) -> Result<(), AnyTransportError>;
    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), AnyTransportError>;
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), AnyTransportError>;
    fn poll_completion(&mut self) -> Option<Completion<AnyTransportError>>;
    fn cancel_transfers(&mut self, dest_session: &str) -> Result<(), AnyTransportError>;
    fn poll_landed(&mut self) -> Option<Landed>;
    fn wake_fd(&self) -> Option<RawFd>;
    fn pool_ptr(&self) -> *mut u8;
    fn pool_len(&self) -> usize;
}

impl<T> Erased for T
where
    T: Transport + PoolOwner + Send,
    T::Error: Send + Sync + 'static,
{
    fn session_id(&self) -> &str {
        Transport::session_id(self)
    }

    fn capabilities(&self) -> Capabilities {
        Transport::capabilities(self)
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, AnyTransportError> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { Transport::register(self, addr, len) }.map_err(AnyTransportError::of::<T>)
    }

    fn deregister(&mut self, region: Region) -> Result<(), AnyTransportError> {
        Transport::deregister(self, region).map_err(AnyTransportError::of::<T>)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), AnyTransportError> {
        Transport::post_write(self, write).map_err(AnyTransportError::of::<T>)
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), AnyTransportError> {
        Transport::post_read(self, read).map_err(AnyTransportError::of::<T>)
    }

    fn poll_completion(&mut self) -> Option<Completion<AnyTransportError>> {
        Transport::poll_completion(self).map(|c| Completion {
            cookie: c.cookie,
            result: c.result.map_err(AnyTransportError::of::<T>),
        })
    }

    fn cancel_transfers(&mut self, dest_session: &str) -> Result<(), AnyTransportError> {
        Transport::cancel_transfers(self, dest_session).map_err(AnyTransportError::of::<T>)
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        Transport::poll_landed(self)
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Transport::wake_fd(self)
    }

    fn pool_ptr(&self) -> *mut u8 {
        PoolOwner::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        PoolOwner::pool_len(self)
    }
}

/// The transport of any data plane, with its pool
/// ([`DataPlane::open`](super::DataPlane::open)).
pub struct AnyTransport(Box<dyn Erased>);

debug_naming!(AnyTransport, |t| { "session_id": t.0.session_id() });

impl AnyTransport {
    /// `transport`, behind this type.
    pub(super) fn new<T>(transport: T) -> Self
    where
        T: Transport + PoolOwner + Send + 'static,
        T::Error: Send + Sync + 'static,
    {
        Self(Box::new(transport))
    }
}

impl Transport for AnyTransport {
    type Error = AnyTransportError;

    fn fault_kind(error: &AnyTransportError) -> FaultKind {
        error.kind()
    }

    fn session_id(&self) -> &str {
        self.0.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, Self::Error> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.0.register(addr, len) }
    }

    fn deregister(&mut self, region: Region) -> Result<(), Self::Error> {
        self.0.deregister(region)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), Self::Error> {
        self.0.post_write(write)
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), Self::Error> {
        self.0.post_read(read)
    }

    fn poll_completion(&mut self) -> Option<Completion<Self::Error>> {
        self.0.poll_completion()
    }

    fn cancel_transfers(&mut self, dest_session: &str) -> Result<(), Self::Error> {
        self.0.cancel_transfers(dest_session)
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        self.0.poll_landed()
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.0.wake_fd()
    }
}

// SAFETY: `new` takes only a `PoolOwner`, whose promise the box keeps: the
// transport is owned by this value for its life, moved with it by pointer
// (the heap allocation does not move), and dropped with it.
unsafe impl PoolOwner for AnyTransport {
    fn pool_ptr(&self) -> *mut u8 {
        self.0.pool_ptr()
    }

    fn pool_len(&self) -> usize {
        self.0.pool_len()
    }
}
