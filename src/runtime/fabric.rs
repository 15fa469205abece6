//! Instance nodes over a libfabric data plane
//! ([`ferry_fabric::FabricTransport`]): a pool in anonymous host memory,
//! registered with the provider, written into by peers with RMA writes;
//! any control channel (ZeroMQ across hosts).

use ferry_core::transport::wait::WaitRecv;
use ferry_core::transport::ControlChannel;
use ferry_fabric::{FabricConfig, FabricTransport};

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceSettings};
use super::owned::{start_on_owned_pool, OwnedPool};

impl OwnedPool for FabricTransport {
    fn pool_ptr(&self) -> *mut u8 {
        FabricTransport::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        FabricTransport::pool_len(self)
    }
}

/// Starts an instance with a new pool of `pool_len` bytes on the provider
/// `config` names, talking over `channel`.
pub fn start_instance<C>(
    settings: &InstanceSettings,
    pool_len: usize,
    config: &FabricConfig,
    channel: C,
) -> Result<InstanceNode<C::Sender>, NodeError>
where
    C: ControlChannel,
    C::Sender: 'static,
    C::Receiver: WaitRecv + 'static,
{
    let transport =
        FabricTransport::with_pool(config, pool_len).map_err(|e| NodeError::Transport {
            verb: "open libfabric transport",
            source: Box::new(e),
        })?;
    tracing::info!(opened = ?transport.opened(), "libfabric data plane");
    start_on_owned_pool(settings, transport, channel)
}
