//! Instances over transports that map their pool themselves (the RDMA data
//! planes: libfabric and ibverbs), with the one SAFETY argument they share.

use ferry_core::transport::wait::{WaitRecv, Wake};
use ferry_core::transport::{ControlChannel, Transport};

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceSettings};
use super::memory::PoolMemory;

/// A transport that owns the memory of its pool.
pub trait OwnedPool {
    /// The pool's first byte.
    fn pool_ptr(&self) -> *mut u8;
    /// Its length.
    fn pool_len(&self) -> usize;
}

/// Starts an instance over `transport`'s own pool, talking over `channel`.
pub fn start_on_owned_pool<T, C>(
    settings: &InstanceSettings,
    transport: T,
    channel: C,
) -> Result<InstanceNode<C::Sender>, NodeError>
where
    T: Transport + Wake + OwnedPool + Send + 'static,
    T::Error: Send + Sync + 'static,
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: WaitRecv + 'static,
{
    // SAFETY: the pool mapping belongs to `transport`, which the node's
    // progress thread owns until the node is dropped, after every view of
    // the pool (they borrow the node) has ended.
    #[allow(unsafe_code)]
    let memory = unsafe { PoolMemory::new(transport.pool_ptr(), transport.pool_len()) };
    InstanceNode::start(settings, transport, memory, channel)
}
