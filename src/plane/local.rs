//! The local data plane ([`tensorferry_local::LocalTransport`]): processes
//! on one host, writing into and reading from each other's registered
//! memory by cross-memory attach (`process_vm_writev`/`readv`). An engine
//! registers the application's memory; a node's pool is anonymous memory
//! of its own process.

use tensorferry_local::{LocalConfig, LocalTransport};
use tensorferry_zmq::Guard;

use super::options::{Options, PlaneError};
use super::Spec;
use crate::engine::EngineError;
use crate::runtime::NodeError;

/// The local plane's spec.
pub(super) struct Local;

impl Spec for Local {
    const NAME: &'static str = "local";
    const OPTIONS: &'static [&'static str] = &["threads", "split_at"];
    type Config = LocalConfig;
    type Node = LocalTransport;
    type NodeError = tensorferry_local::LocalError;
    type Engine = LocalTransport;

    /// Reads `threads` (copy threads for a large transfer, the caller's
    /// included) and `split_at` (bytes from which one is split over them).
    fn parse(o: Options) -> Result<LocalConfig, PlaneError> {
        let mut c = LocalConfig::default();
        (c.threads, c.split_at) = o.finish_copy(c.threads, c.split_at)?;
        Ok(c)
    }

    fn open_node(config: &LocalConfig, pool_len: usize) -> Result<LocalTransport, NodeError> {
        LocalTransport::with_pool(config.clone(), pool_len)
            .map_err(|e| NodeError::transport("open the local transport", e.kind(), e))
    }

    fn open_engine(config: LocalConfig, _: &Guard) -> Result<LocalTransport, EngineError> {
        Ok(LocalTransport::open(config)?)
    }

    fn reaches_other_hosts(_: &LocalConfig) -> bool {
        false
    }
}
