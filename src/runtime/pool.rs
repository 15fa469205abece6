//! A pool the node maps for a transport that owns none: an embedder's
//! data plane implements [`Transport`] alone, and the node pairs it with
//! anonymous memory of its own ([`HostPool`]), registers that, and keeps
//! the pool mapped for as long as the transport lives.
// The pairing makes the pool promise (`PoolOwner`) for the memory it
// owns, and forwards `Transport::register`'s contract unchanged: the
// module's two unsafe items.
#![allow(unsafe_code)]

use std::os::fd::RawFd;

use tensorferry_core::transport::{
    Capabilities, Completion, FaultKind, Landed, PoolOwner, ReadOp, Region, Transport, WriteOp,
};
use tensorferry_hostmem::HostPool;

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceNodeConfig};
use super::InstanceChannel;

/// A transport and the pool mapped for it. The fields drop in order: the
/// transport first (it deregisters, so no peer writes any more), then the
/// pool (unmapped), so the memory outlives every registration of it.
struct WithPool<T> {
    transport: T,
    pool: HostPool,
}

// SAFETY: the mapping is owned by `pool` (a private anonymous mapping made
// in `HostPool::new`, at an address that does not change when the value
// moves) and unmapped only when it drops, after the transport; nothing
// here hands out the `HostPool` or replaces it, and the transport was
// never given a way to unmap it (it only registers the range). That no
// write or read the transport started touches the range once it is
// dropped is `Transport::register`'s promise to its caller; a transport
// can touch memory it was given only as an address, through unsafe code
// (a raw pointer, a device, another process) of its own, whose safety
// argument owes that promise.
unsafe impl<T> PoolOwner for WithPool<T> {
    fn pool_ptr(&self) -> *mut u8 {
        self.pool.ptr()
    }

    fn pool_len(&self) -> usize {
        self.pool.len()
    }
}

impl<T: Transport> Transport for WithPool<T> {
    type Error = T::Error;

    fn fault_kind(error: &T::Error) -> FaultKind {
        T::fault_kind(error)
    }

    fn session_id(&self) -> &str {
        self.transport.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        self.transport.capabilities()
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, T::Error> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.transport.register(addr, len) }
    }

    fn deregister(&mut self, region: Region) -> Result<(), T::Error> {
        self.transport.deregister(region)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), T::Error> {
        self.transport.post_write(write)
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), T::Error> {
        self.transport.post_read(read)
    }

    fn poll_completion(&mut self) -> Option<Completion<T::Error>> {
        self.transport.poll_completion()
    }

    fn cancel_transfers(&mut self, session: &str) -> Result<(), T::Error> {
        self.transport.cancel_transfers(session)
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        self.transport.poll_landed()
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.transport.wake_fd()
    }
}

impl InstanceNode {
    /// Starts an instance over `transport`, a data plane that owns no
    /// pool: the node maps a pool of `pool_len` bytes of its own
    /// (anonymous memory, populated now), registers it with the transport,
    /// and receives into and stages in it, talking over `channel`. The
    /// node keeps both until it is dropped, and drops the transport before
    /// it unmaps the pool: the transport keeps
    /// [`Transport::register`]'s promise that nothing it started touches
    /// the pool once it is dropped. This is how an embedder runs a node over its
    /// own fabric: [`Transport`],
    /// [`ControlSend`](tensorferry_core::transport::ControlSend) and
    /// [`ControlRecv`](tensorferry_core::transport::ControlRecv) are all it
    /// implements. A data plane that owns its pool (ferry's own, opened by
    /// [`DataPlane`](crate::plane::DataPlane)) starts with
    /// [`start`](Self::start) instead.
    pub fn start_with_pool<T, C>(
        settings: &InstanceNodeConfig,
        pool_len: usize,
        transport: T,
        channel: C,
    ) -> Result<Self, NodeError>
    where
        T: Transport + Send + 'static,
        T::Error: Send + Sync + 'static,
        C: InstanceChannel,
    {
        if pool_len == 0 {
            return Err(NodeError::NoPool);
        }
        let pool = HostPool::new(pool_len).map_err(|source| NodeError::MapPool {
            len: pool_len,
            source,
        })?;
        Self::start(settings, WithPool { transport, pool }, channel)
    }
}
