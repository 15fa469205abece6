//! Nodes over the shared-memory loopback: pools in POSIX shared memory
//! ([`ferry_shm::ShmTransport`]) and Unix-socket control channels
//! ([`ferry_shm::UdsChannel`]), for processes on one host.

use ferry_core::transport::wait::{WaitRecv, Wake};
use ferry_core::transport::{ControlChannel, Transport};
use ferry_shm::{ShmTransport, UdsChannel, UdsSender};

use super::coordinator::{CoordinatorNode, CoordinatorSettings};
use super::error::NodeError;
use super::instance::{InstanceNode, InstanceSettings};
use super::memory::PoolMemory;

/// An instance node on the shared-memory loopback.
pub type ShmInstance = InstanceNode<UdsSender>;

/// How a shared-memory instance copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopySettings {
    /// Threads a large write is split across (the caller's included).
    pub threads: usize,
    /// Writes of at least this many bytes are split.
    pub split_at: usize,
}

impl Default for CopySettings {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            split_at: 4 << 20,
        }
    }
}

/// Starts an instance with a new shared-memory pool of `pool_len` bytes,
/// listening at `endpoint` (`ipc://<path>`).
pub fn start_instance(
    settings: &InstanceSettings,
    pool_len: usize,
    copy: CopySettings,
    endpoint: &str,
) -> Result<ShmInstance, NodeError> {
    start_instance_wrapped(settings, pool_len, copy, endpoint, |t| t, |c| c)
}

/// Starts an instance with a new shared-memory pool of `pool_len` bytes,
/// talking over `channel` (a ZeroMQ one, say).
pub fn start_instance_on<C>(
    settings: &InstanceSettings,
    pool_len: usize,
    copy: CopySettings,
    channel: C,
) -> Result<InstanceNode<C::Sender>, NodeError>
where
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: WaitRecv + 'static,
{
    let (transport, memory) = pool(pool_len, copy)?;
    InstanceNode::start(settings, transport, memory, channel)
}

/// Starts a coordinator listening at `endpoint` (`ipc://<path>`), for
/// instances on this host.
pub fn start_coordinator(
    settings: &CoordinatorSettings,
    endpoint: &str,
) -> Result<CoordinatorNode, NodeError> {
    let channel = bind(endpoint)?;
    CoordinatorNode::start(settings, channel, |_| {})
}

/// A Unix-socket control channel bound at `endpoint`.
fn bind(endpoint: &str) -> Result<UdsChannel, NodeError> {
    UdsChannel::bind(endpoint).map_err(|e| NodeError::Transport {
        verb: "bind control endpoint",
        source: Box::new(e),
    })
}

/// A new shared-memory pool and the runtime's view of it.
fn pool(pool_len: usize, copy: CopySettings) -> Result<(ShmTransport, PoolMemory), NodeError> {
    let transport = ShmTransport::new(pool_len, copy.threads, copy.split_at).map_err(|e| {
        NodeError::Transport {
            verb: "create pool",
            source: Box::new(e),
        }
    })?;
    // SAFETY: the pool mapping belongs to `transport`, which the node's
    // progress thread owns (wrapped or not) until the node is dropped,
    // after every view of the pool (they borrow the node) has ended.
    #[allow(unsafe_code)]
    let memory = unsafe { PoolMemory::new(transport.pool_ptr(), transport.pool_len()) };
    Ok((transport, memory))
}

/// Like [`start_instance`], with the transport and the channel wrapped
/// (by [`crate::fault`]'s injectors, say) before the node takes them.
pub fn start_instance_wrapped<T, C>(
    settings: &InstanceSettings,
    pool_len: usize,
    copy: CopySettings,
    endpoint: &str,
    wrap_transport: impl FnOnce(ShmTransport) -> T,
    wrap_channel: impl FnOnce(UdsChannel) -> C,
) -> Result<InstanceNode<C::Sender>, NodeError>
where
    T: Transport + Wake + Send + 'static,
    T::Error: Send + Sync + 'static,
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: WaitRecv + 'static,
{
    let (transport, memory) = pool(pool_len, copy)?;
    let channel = bind(endpoint)?;
    InstanceNode::start(
        settings,
        wrap_transport(transport),
        memory,
        wrap_channel(channel),
    )
}
