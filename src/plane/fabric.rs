//! The libfabric data plane ([`tensorferry_fabric::FabricTransport`]): a pool in
//! anonymous host memory, registered with the provider, written into by
//! peers with RMA writes (EFA, verbs, tcp, shm providers).

use tensorferry_fabric::{DeliveryMode, FabricConfig, FabricError, FabricTransport, Provider};
use tensorferry_zmq::Guard;

use super::options::{Options, PlaneError};
use super::Spec;
use crate::engine::EngineError;
use crate::runtime::NodeError;

/// The libfabric plane's spec.
pub(super) struct Fabric;

impl Spec for Fabric {
    const NAME: &'static str = "fabric";
    const OPTIONS: &'static [&'static str] = &[
        "provider",
        "delivery",
        "source",
        "max_chunk",
        "write_timeout",
    ];
    type Config = FabricConfig;
    type Node = FabricTransport;
    type NodeError = FabricError;
    type Engine = FabricTransport;

    /// Reads `provider` (`auto` or a libfabric name), `delivery` (`auto`,
    /// `delivery-complete`, `remote-cq-data`), `source` (an address of
    /// this host), `max_chunk` (bytes; 0: the provider's largest message)
    /// and `write_timeout`.
    fn parse(mut o: Options) -> Result<FabricConfig, PlaneError> {
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

    /// A transport with a new pool of `pool_len` bytes on the provider
    /// `config` names.
    fn open_node(config: &FabricConfig, pool_len: usize) -> Result<FabricTransport, NodeError> {
        let t = FabricTransport::with_pool(config, pool_len)
            .map_err(|e| NodeError::transport("open libfabric transport", e.kind(), e))?;
        tracing::info!(opened = ?t.opened(), "libfabric data plane");
        Ok(t)
    }

    /// Delivery-complete writes whatever `delivery` says (a write's
    /// completion must mean its bytes are at the peer), on a provider
    /// that can end a peer's operations.
    fn open_engine(mut config: FabricConfig, _: &Guard) -> Result<FabricTransport, EngineError> {
        if config.delivery == DeliveryMode::Notify {
            return Err(EngineError::Unsuitable {
                plane: Self::NAME.into(),
                why: "its option delivery=remote-cq-data is a node's: a transfer's completion must mean its bytes are at the peer (delivery-complete, which the engine asks for)".into(),
            });
        }
        config.delivery = DeliveryMode::Complete;
        let t = FabricTransport::open(&config)
            .map_err(|e| EngineError::transport("open the libfabric transport", e.kind(), &e))?;
        if !t.opened().ends_operations {
            return Err(EngineError::Unsuitable {
                plane: format!("libfabric {}", t.opened().provider),
                why: "it cannot end an operation a peer has taken (libfabric 1.17's shm: a peer copies its bytes in its own time), so a transfer given up could still move bytes after its call returned; between processes on one host use the local data plane, across hosts libfabric's tcp;ofi_rxm (or verbs)".into(),
            });
        }
        Ok(t)
    }

    /// True unless the provider is libfabric's shared-memory one.
    fn reaches_other_hosts(c: &FabricConfig) -> bool {
        c.provider != Provider::Named("shm".into())
    }

    /// Always, its shm provider included: libfabric's nodes are started
    /// over ZeroMQ alone (the CLI's pipeline and instances, the launcher,
    /// the benchmarks), which is the pairing their tests run; one
    /// provider's reach does not change whom its nodes talk to.
    fn needs_zmq(_: &FabricConfig) -> bool {
        true
    }
}
