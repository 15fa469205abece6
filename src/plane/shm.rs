//! The shared-memory data plane ([`tensorferry_shm::ShmTransport`]): pools in
//! POSIX shared memory, written by peers' processes on the same host.

use tensorferry_shm::ShmTransport;
use tensorferry_zmq::Guard;

use super::options::{Options, PlaneError};
use super::Spec;
use crate::engine::EngineError;
use crate::runtime::NodeError;

/// How a shared-memory instance copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyConfig {
    /// Threads a large write is split across (the caller's included).
    pub threads: usize,
    /// Writes of at least this many bytes are split.
    pub split_at: usize,
}

impl Default for CopyConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            split_at: 4 << 20,
        }
    }
}

/// The shared-memory plane's spec.
pub(super) struct Shm;

impl Spec for Shm {
    const NAME: &'static str = "shm";
    const OPTIONS: &'static [&'static str] = &["threads", "split_at"];
    type Config = CopyConfig;
    type Node = ShmTransport;
    type NodeError = tensorferry_shm::ShmError;
    type Engine = ShmTransport;

    /// Reads `threads` and `split_at` (bytes).
    fn parse(o: Options) -> Result<CopyConfig, PlaneError> {
        let mut c = CopyConfig::default();
        let (threads, split_at) = o.finish_copy(c.threads, c.split_at as u64)?;
        c.threads = threads;
        c.split_at = usize::try_from(split_at).unwrap_or(usize::MAX);
        Ok(c)
    }

    fn open_node(copy: &CopyConfig, pool_len: usize) -> Result<ShmTransport, NodeError> {
        ShmTransport::new(pool_len, copy.threads, copy.split_at)
            .map_err(|e| NodeError::transport("create pool", e.kind(), e))
    }

    fn open_engine(_: CopyConfig, _: &Guard) -> Result<ShmTransport, EngineError> {
        Err(EngineError::Unsuitable {
            plane: Self::NAME.into(),
            why: "its pools are a node's own, and an engine moves memory the application allocated: between processes on one host use the local data plane".into(),
        })
    }

    fn reaches_other_hosts(_: &CopyConfig) -> bool {
        false
    }
}
