//! A transfer engine: sglang's `BaseTransferEngine` contract in Rust.
//!
//! Register any memory of this process, then write from it into a peer's
//! registered memory by the peer's session id and absolute addresses, and
//! return once every byte is at the peer. This is the level below ferry's
//! nodes (no control plane, no slots): what a serving runtime that keeps
//! its own pools and protocol (sglang's `DiffusionTransferManager`) asks
//! of a data plane. The Python module's `ferry.TransferEngine` is this
//! type.
//!
//! Every backend is a data plane behind ferry-core's `Transport` seam,
//! driven the same way (`posted`): writes are posted, and a call returns
//! when every write it posted has completed.
//! * [`Backend::Local`]: processes on one host, any memory, by
//!   cross-memory attach ([`ferry_local::LocalTransport`]).
//! * `Backend::Fabric` (feature `fabric`): ferry's libfabric data plane,
//!   delivery-complete writes.
//! * `Backend::Verbs` (feature `verbs`): RC queue pairs on an RDMA NIC.
//!
//! All of it is safe to call from many threads at once; a process that
//! only receives needs no calls at all (a thread of the engine answers
//! peers where the data plane needs one).

// Registration hands memory's lifetime to the caller, which only an unsafe
// signature can say.
#![allow(unsafe_code)]

mod posted;

use std::time::Duration;

use ferry_core::transport::{Fault, FaultKind};
pub use ferry_local::{LocalConfig, LocalError, Op};

/// Which data plane an engine runs on.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Backend {
    /// Processes on one host (any memory they registered).
    Local(LocalConfig),
    /// ferry's libfabric data plane; the engine asks for delivery-complete
    /// writes whatever `delivery` says (a write's completion must mean its
    /// bytes are at the peer).
    #[cfg(feature = "fabric")]
    Fabric(ferry_fabric::FabricConfig),
    /// ferry's ibverbs data plane.
    #[cfg(feature = "verbs")]
    Verbs(ferry_verbs::VerbsConfig),
}

impl Backend {
    /// The best data plane present: an RDMA NIC's verbs when this build
    /// has them and the host has a device, else the local engine (which
    /// reaches processes on this host only).
    pub fn auto() -> Self {
        #[cfg(feature = "verbs")]
        if let Ok(names) = ferry_verbs::device_names() {
            if let Some(first) = names.into_iter().next() {
                return Self::Verbs(ferry_verbs::VerbsConfig::new(first));
            }
        }
        Self::Local(LocalConfig::default())
    }

    /// Its name: `local`, `fabric` or `verbs`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Local(_) => "local",
            #[cfg(feature = "fabric")]
            Self::Fabric(_) => "fabric",
            #[cfg(feature = "verbs")]
            Self::Verbs(_) => "verbs",
        }
    }
}

/// An engine's error: what failed, with the peer, address or call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// From the local engine, while opening it.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// From a data plane's transport.
    #[error("{verb}: {message}")]
    Transport {
        /// What was being done.
        verb: &'static str,
        /// The transport's error, as it says it.
        message: String,
        /// Its kind.
        kind: FaultKind,
    },
    /// A source outside every region this engine registered.
    #[error(
        "write of {len} bytes from {addr:#x} falls outside every region this engine registered"
    )]
    SourceOutOfBounds {
        /// The source address.
        addr: u64,
        /// The write's length.
        len: u64,
    },
    /// `deregister` of an address no region starts at.
    #[error("deregister {addr:#x}: no registered region starts there")]
    NotRegistered {
        /// The address.
        addr: u64,
    },
    /// Writes not finished in time.
    #[error("transfer to {session}: {pending} of {total} writes not finished after {waited:?}")]
    Timeout {
        /// The peer's session id.
        session: String,
        /// Writes still running.
        pending: usize,
        /// Writes in the transfer.
        total: usize,
        /// How long was waited.
        waited: Duration,
    },
    /// The batch's lists have different lengths.
    #[error("a batch of {sources} sources, {dests} destinations and {lengths} lengths")]
    BatchShape {
        /// Sources given.
        sources: usize,
        /// Destinations given.
        dests: usize,
        /// Lengths given.
        lengths: usize,
    },
    /// The engine was closed.
    #[error("the transfer engine is closed")]
    Closed,
}

impl EngineError {
    /// What kind of failure it is.
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Local(e) => e.kind(),
            Self::Transport { kind, .. } => *kind,
            Self::SourceOutOfBounds { .. } => FaultKind::OutOfBounds,
            Self::NotRegistered { .. } => FaultKind::Registration,
            Self::Timeout { .. } => FaultKind::Timeout,
            Self::BatchShape { .. } | Self::Closed => FaultKind::Io,
        }
    }

    fn transport<E: Fault>(verb: &'static str, e: &E) -> Self {
        Self::Transport {
            verb,
            message: e.to_string(),
            kind: e.kind(),
        }
    }
}

/// A transfer engine (see the module's documentation).
pub struct TransferEngine {
    inner: Box<dyn posted::Posted>,
    backend: &'static str,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("backend", &self.backend)
            .field("session_id", &self.session_id())
            .finish()
    }
}

impl TransferEngine {
    /// Opens an engine on `backend`, with no memory registered.
    pub fn open(backend: Backend) -> Result<Self, EngineError> {
        let name = backend.name();
        let inner: Box<dyn posted::Posted> = match backend {
            Backend::Local(config) => {
                let t = ferry_local::LocalTransport::open(config)?;
                Box::new(posted::Driven::start(t)?)
            }
            #[cfg(feature = "fabric")]
            Backend::Fabric(mut config) => {
                config.delivery = ferry_fabric::DeliveryMode::Complete;
                let t = ferry_fabric::FabricTransport::open(&config)
                    .map_err(|e| EngineError::transport("open the libfabric transport", &e))?;
                Box::new(posted::Driven::start(t)?)
            }
            #[cfg(feature = "verbs")]
            Backend::Verbs(config) => {
                let t = ferry_verbs::VerbsTransport::open(&config)
                    .map_err(|e| EngineError::transport("open the verbs transport", &e))?;
                Box::new(posted::Driven::start(t)?)
            }
        };
        Ok(Self {
            inner,
            backend: name,
        })
    }

    /// The backend's name: `local`, `fabric` or `verbs`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The session id peers write to this engine by. Some data planes name
    /// the registered regions in it (libfabric's keys), so read it after
    /// registering.
    pub fn session_id(&self) -> String {
        self.inner.session_id()
    }

    /// Registers `len` bytes at `addr`, for peers to write into and this
    /// engine to write from.
    ///
    /// # Safety
    /// The memory must stay mapped until [`deregister`](Self::deregister)
    /// returns or the engine is dropped, and the caller must expect peers
    /// to write into it at any time while registered.
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.register(addr, len) }
    }

    /// Ends the registration of the region that starts at `addr`.
    pub fn deregister(&self, addr: u64) -> Result<(), EngineError> {
        self.inner.deregister(addr)
    }

    /// Writes every op into the peer `session` and returns once every byte
    /// is at the peer, or fails.
    ///
    /// Whatever it returns, no byte of the call is read from its sources
    /// or written into the peer afterwards: past `timeout` the data plane
    /// ends the writes still running (a verbs queue pair flushed, a local
    /// write not yet made dropped, a libfabric peer's connection torn
    /// down), and the call returns [`EngineError::Timeout`] once they have
    /// ended. One exception: libfabric ends posted writes only with
    /// `FI_AV_REMOVE_CLEANUP=1` in the environment (off by default, see
    /// `ferry_fabric::ofi::AV_REMOVE_CLEANUP`); without it a timed-out
    /// fabric write's chunks already posted may still move. The data
    /// plane's own write timeout, where it has one, fails a write earlier
    /// if it is shorter.
    pub fn write(&self, session: &str, ops: &[Op], timeout: Duration) -> Result<(), EngineError> {
        self.inner.write(session, ops, timeout)
    }

    /// [`write`](Self::write) of a batch given as three lists (sglang's
    /// `batch_transfer_sync`), refused if their lengths differ.
    pub fn write_lists(
        &self,
        session: &str,
        sources: &[u64],
        dests: &[u64],
        lengths: &[u64],
        timeout: Duration,
    ) -> Result<(), EngineError> {
        if sources.len() != dests.len() || dests.len() != lengths.len() {
            return Err(EngineError::BatchShape {
                sources: sources.len(),
                dests: dests.len(),
                lengths: lengths.len(),
            });
        }
        let ops: Vec<Op> = sources
            .iter()
            .zip(dests)
            .zip(lengths)
            .map(|((&src, &dst), &len)| Op { src, dst, len })
            .collect();
        self.write(session, &ops, timeout)
    }
}
