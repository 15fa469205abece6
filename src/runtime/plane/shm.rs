//! The shared-memory data plane ([`tensorferry_shm::ShmTransport`]): pools in
//! POSIX shared memory, written by peers' processes on the same host.

use tensorferry_shm::ShmTransport;

use super::options::{Options, PlaneError};
use crate::runtime::error::NodeError;

/// Its name.
pub(super) const NAME: &str = "shm";

/// The options it takes.
pub(super) const OPTIONS: &[&str] = &["threads", "split_at"];

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

/// Reads `threads` and `split_at` (bytes).
pub(super) fn parse(mut o: Options) -> Result<CopyConfig, PlaneError> {
    let mut c = CopyConfig::default();
    if let Some(t) = o.parsed::<usize>("threads")? {
        c.threads = t.max(1);
    }
    if let Some(s) = o.parsed::<usize>("split_at")? {
        c.split_at = s;
    }
    o.finish()?;
    Ok(c)
}

/// A transport with a new pool of `pool_len` bytes.
pub(super) fn open(copy: &CopyConfig, pool_len: usize) -> Result<ShmTransport, NodeError> {
    ShmTransport::new(pool_len, copy.threads, copy.split_at)
        .map_err(|e| NodeError::transport("create pool", e))
}
