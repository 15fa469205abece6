//! Instance nodes over the ibverbs data plane
//! ([`ferry_verbs::VerbsTransport`]): a pool in anonymous host memory,
//! registered with the NIC, written into by peers with RDMA WRITE over RC
//! queue pairs; any control channel (ZeroMQ across hosts).

use ferry_core::transport::wait::WaitRecv;
use ferry_core::transport::ControlChannel;
use ferry_verbs::{Device, VerbsConfig, VerbsTransport};

use super::error::NodeError;
use super::instance::{InstanceNode, InstanceSettings};
use super::owned::{start_on_owned_pool, OwnedPool};

impl<D: Device> OwnedPool for VerbsTransport<D> {
    fn pool_ptr(&self) -> *mut u8 {
        VerbsTransport::pool_ptr(self)
    }

    fn pool_len(&self) -> usize {
        VerbsTransport::pool_len(self)
    }
}

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
    C::Receiver: WaitRecv + 'static,
{
    let transport =
        VerbsTransport::with_pool(config, pool_len).map_err(|e| NodeError::Transport {
            verb: "open verbs transport",
            source: Box::new(e),
        })?;
    start_on_owned_pool(settings, transport, channel)
}
