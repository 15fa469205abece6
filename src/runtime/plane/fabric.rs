//! The libfabric data plane ([`tensorferry_fabric::FabricTransport`]): a pool in
//! anonymous host memory, registered with the provider, written into by
//! peers with RMA writes (EFA, verbs, tcp, shm providers).

use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricTransport, Provider};

use super::options::{Options, PlaneError};
use crate::runtime::error::NodeError;

/// Its name.
pub(super) const NAME: &str = "fabric";

/// The options it takes.
pub(super) const OPTIONS: &[&str] = &[
    "provider",
    "delivery",
    "source",
    "max_chunk",
    "write_timeout",
];

/// Reads `provider` (`auto` or a libfabric name), `delivery` (`auto`,
/// `delivery-complete`, `remote-cq-data`), `source` (an address of this
/// host), `max_chunk` (bytes; 0: the provider's largest message) and
/// `write_timeout`.
pub(super) fn parse(mut o: Options) -> Result<FabricConfig, PlaneError> {
    let provider = o.parsed::<Provider>("provider")?.unwrap_or(Provider::Auto);
    let mut c = FabricConfig::new(provider);
    if let Some(d) = o.parsed::<DeliveryMode>("delivery")? {
        c.delivery = d;
    }
    c.source = o.text("source");
    if let Some(m) = o.parsed::<u64>("max_chunk")? {
        c.max_chunk = m;
    }
    if let Some(t) = o.duration("write_timeout")? {
        c.write_timeout = t;
    }
    o.finish()?;
    Ok(c)
}

/// True unless the provider is libfabric's shared-memory one.
pub(super) fn reaches_other_hosts(c: &FabricConfig) -> bool {
    c.provider != Provider::Named("shm".into())
}

/// A transport with a new pool of `pool_len` bytes on the provider
/// `config` names.
pub(super) fn open(config: &FabricConfig, pool_len: usize) -> Result<FabricTransport, NodeError> {
    let t = FabricTransport::with_pool(config, pool_len)
        .map_err(|e| NodeError::transport("open libfabric transport", e))?;
    tracing::info!(opened = ?t.opened(), "libfabric data plane");
    Ok(t)
}
