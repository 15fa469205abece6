//! Opening a transport: its configuration, the first provider and
//! delivery mode `fi_getinfo` offers, the libfabric objects, the shared
//! bookkeeping and the progress thread.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tensorferry_core::transport::Regions;
use tensorferry_fabric_sys as sys;
use tensorferry_hostmem::{EventFd, HostPool};
use tracing::debug;

use super::book::{Contexts, OpBook};
use super::progress::Shared;
use super::FabricTransport;
use crate::error::FabricError;
use crate::mr::MrPolicy;
use crate::notice::{NoticeBook, NoticeFormat};
use crate::ofi::{Av, Cq, Domain, Endpoint, Fabric, Info};
use crate::provider::{DeliveryMode, Hints, Provider, READ_CAPS};

/// How to open a libfabric transport.
#[derive(Clone, Debug)]
pub struct FabricConfig {
    /// Which provider.
    pub provider: Provider,
    /// How delivery is made sure of before a receiver is told to read.
    pub delivery: DeliveryMode,
    /// An address of this host to bind to (`fi_getinfo` node with
    /// `FI_SOURCE`), to pick the interface; `None`: the provider's choice
    /// (for `tcp`, `FI_TCP_IFACE` also picks it).
    pub source: Option<String>,
    /// Largest chunk a write is split into; 0: the provider's
    /// `max_msg_size`.
    pub max_chunk: u64,
    /// Chunks in flight at once (each needs an operation context).
    pub max_outstanding: usize,
    /// A write or read that neither completes nor fails within this is
    /// ended: its chunks still queued are dropped, those posted are ended
    /// (by a reset of the endpoint where the provider does not end them at
    /// once), and it is reported failed only then, so that a write's
    /// source is never read, and a read's destination never written,
    /// afterwards. Over `tcp`, bytes of a write the peer's kernel had
    /// already received may still be placed when the peer next drives its
    /// queue. Keep it below the coordinator's push timeout (10 s by
    /// default).
    pub write_timeout: Duration,
}

impl FabricConfig {
    /// Defaults for `provider`.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
            delivery: DeliveryMode::Auto,
            source: None,
            max_chunk: 0,
            max_outstanding: 256,
            write_timeout: Duration::from_secs(5),
        }
    }
}

/// What was opened, for logs and benchmarks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The provider's name.
    pub provider: String,
    /// The fabric's name.
    pub fabric: String,
    /// The domain's name.
    pub domain: String,
    /// The delivery mode in force.
    pub delivery: DeliveryMode,
    /// The registration rules.
    pub mr: MrPolicy,
    /// The chunk size writes and reads are split at.
    pub chunk: u64,
    /// The provider offers one-sided reads (`FI_READ` and
    /// `FI_REMOTE_READ`); without them `post_read` is refused and writes
    /// work as before.
    pub reads: bool,
    /// True if the progress thread can sleep in `fi_cq_sread`.
    pub waitable_cq: bool,
    /// True if the transport can end an operation a peer has taken (it
    /// resets its endpoint under it): the providers over rxm. Elsewhere
    /// (libfabric 1.17's `shm`) such an operation ends only when the peer
    /// ends it, and is not reported before; a caller that must be able to
    /// give up on a peer (the transfer engine) refuses such a provider.
    pub ends_operations: bool,
}
impl FabricTransport {
    /// Opens a transport (no pool yet:
    /// [`register`](tensorferry_core::transport::Transport::register) one, or use
    /// [`with_pool`](Self::with_pool)).
    pub fn open(config: &FabricConfig) -> Result<Self, FabricError> {
        let (info, delivery) = find(config)?;
        let provider = info.provider();
        if info.threading() != sys::fi_threading_FI_THREAD_SAFE {
            return Err(FabricError::Unsupported {
                provider,
                what: "does not grant FI_THREAD_SAFE".into(),
            });
        }
        let mr = MrPolicy::from_mode(info.mr_mode(), info.mr_key_size()).map_err(|what| {
            FabricError::Unsupported {
                provider: provider.clone(),
                what,
            }
        })?;
        if !mr.prov_key && mr.key_size < 8 {
            // Its keys are all that stands between a host that reaches the
            // provider and the regions: fewer bits are easier to guess.
            tracing::warn!(
                %provider,
                key_bytes = mr.key_size,
                "this provider's memory keys are narrower than 64 bits: a host that reaches it guesses one sooner"
            );
        }
        let cq_data_size = info.cq_data_size();
        if delivery == DeliveryMode::Notify && cq_data_size < 4 {
            return Err(FabricError::Unsupported {
                provider,
                what: format!("carries {cq_data_size} bytes of remote CQ data; notices need 4"),
            });
        }
        let max_msg = info.max_msg_size().max(1);
        let chunk = if config.max_chunk == 0 {
            max_msg
        } else {
            config.max_chunk.min(max_msg)
        };
        let fabric = Fabric::open(&info)?;
        let domain = Domain::open(&fabric, &info)?;
        let outstanding = config.max_outstanding.clamp(1, 1 << 16);
        let cq_size = (2 * outstanding).max(1024);
        let cq = Cq::open(&domain, cq_size)?;
        let av = Av::open(&domain)?;
        let endpoint = Endpoint::open(&domain, &info, &cq, &av)?;
        let notice_format = NoticeFormat::new(cq_data_size >= 8);
        let reads = info.caps() & READ_CAPS == READ_CAPS;
        let ends_operations = super::reset::resettable(&provider);
        let opened = Opened {
            provider,
            fabric: info.fabric_name(),
            domain: info.domain_name(),
            delivery,
            mr,
            chunk,
            reads,
            waitable_cq: cq.waitable(),
            ends_operations,
        };
        let wake = EventFd::new().map_err(|source| FabricError::Os {
            what: "create the wake eventfd",
            source,
        })?;
        let endpoint_name = endpoint.name().to_vec();
        let shared = Arc::new(Shared {
            wake,
            cq: std::sync::RwLock::new(cq),
            endpoint: std::sync::RwLock::new(Some(endpoint)),
            pause: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            book: Mutex::new(OpBook {
                backlog: VecDeque::with_capacity(outstanding),
                free_ctx: (0..outstanding as u32).rev().collect(),
                ctx_owner: vec![u32::MAX; outstanding],
                ctx_chunk: vec![None; outstanding],
                ops: Vec::with_capacity(outstanding),
                free_ops: Vec::new(),
                done: VecDeque::with_capacity(outstanding),
                notices: NoticeBook::new(notice_format, Duration::from_secs(120), 1 << 16),
                evict: Vec::new(),
                held: false,
                news: false,
            }),
            stop: AtomicBool::new(false),
            beat: AtomicU64::new(0),
            born: Instant::now(),
            contexts: Contexts(
                (0..outstanding)
                    .map(|_| std::cell::UnsafeCell::new(sys::fi_context2::default()))
                    .collect(),
            ),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ferry-fabric".into())
                .spawn(move || shared.run())
                .map_err(|source| FabricError::Os {
                    what: "start the progress thread",
                    source,
                })?
        };
        let mut t = Self {
            regions: Regions::new(crate::MAX_REGIONS),
            thread: Some(thread),
            shared,
            endpoint_name,
            av,
            domain,
            pool: None,
            peers: HashMap::new(),
            opened,
            session: String::new(),
            notice_format,
            cq_data_size,
            write_timeout: config.write_timeout,
            stuck_reported: false,
            reset_failed: None,
            cq_size,
            next_sweep: Instant::now(),
            info,
        };
        t.session = t.session_text();
        debug!(opened = ?t.opened, "libfabric transport open");
        Ok(t)
    }

    /// Opens a transport with a pool of `len` bytes of its own (map it
    /// with [`pool_ptr`](Self::pool_ptr), then register it).
    pub fn with_pool(config: &FabricConfig, len: usize) -> Result<Self, FabricError> {
        let mut t = Self::open(config)?;
        t.pool = Some(HostPool::new(len).map_err(|source| FabricError::Os {
            what: "map pool",
            source,
        })?);
        Ok(t)
    }
}

/// Asks for provider `name` in `delivery` mode with reads, and for writes
/// alone where it offers no reads (see [`READ_CAPS`]); the answer's
/// capabilities say which was granted.
pub(crate) fn probe(
    name: &str,
    delivery: DeliveryMode,
    source: Option<&str>,
) -> Result<Info, FabricError> {
    let hints = Hints::new(name, delivery);
    Info::get(&hints, source).or_else(|_| Info::get(&hints.without_reads(), source))
}

/// Finds the first provider and delivery mode that `fi_getinfo` offers.
pub(crate) fn find(config: &FabricConfig) -> Result<(Info, DeliveryMode), FabricError> {
    let mut why = Vec::new();
    for name in config.provider.candidates() {
        for &delivery in config.delivery.candidates() {
            match probe(name, delivery, config.source.as_deref()) {
                Ok(info) => return Ok((info, delivery)),
                Err(e) => why.push(format!("{name} ({}): {e}", delivery.as_str())),
            }
        }
    }
    Err(FabricError::NoProvider {
        wanted: config.provider.to_string(),
        delivery: match config.delivery {
            DeliveryMode::Auto => "",
            d => d.as_str(),
        },
        why: why.join("; "),
    })
}
