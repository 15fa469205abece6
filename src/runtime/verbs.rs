//! Instance nodes over the ibverbs data plane
//! ([`ferry_verbs::VerbsTransport`]): a pool in anonymous host memory,
//! registered with the NIC, written into by peers with RDMA WRITE over RC
//! queue pairs; any control channel (ZeroMQ across hosts).

use ferry_core::transport::ControlChannel;
use ferry_verbs::{VerbsConfig, VerbsTransport};

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceSettings};
use super::memory::PoolMemory;

/// Starts an instance with a new pool of `pool_len` bytes on the device
/// port `config` names, talking over `channel`.
pub fn start_instance<C>(
    settings: &InstanceSettings,
    pool_len: usize,
    config: &VerbsConfig,
    channel: C,
) -> Result<InstanceNode<C::Sender>, NodeError>
where
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: 'static,
{
    let transport =
        VerbsTransport::with_pool(config, pool_len).map_err(|e| NodeError::Transport {
            verb: "open verbs transport",
            source: Box::new(e),
        })?;
    // SAFETY: the pool mapping belongs to `transport`, which the node's
    // progress thread owns until the node is dropped, after every view of
    // the pool (they borrow the node) has ended.
    #[allow(unsafe_code)]
    let memory = unsafe { PoolMemory::new(transport.pool_ptr(), transport.pool_len()) };
    InstanceNode::start(settings, transport, memory, channel)
}
