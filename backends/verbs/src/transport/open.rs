//! Opening a transport: the device port and its GID, the side channel
//! (bound, guarded, its address checked to be one peers can dial), the
//! wake-up pipe to its thread, the connection book, and the thread itself.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tensorferry_hostmem::HostPool;
use tensorferry_zmq::zmq;

use super::{VerbsConfig, VerbsTransport};
use crate::conn::{ConnBook, ConnLimits};
use crate::device::Device;
use crate::error::VerbsError;
use crate::gid::{choose, gid_text, ipv4_of};
use crate::ibv::IbvDevice;
use crate::session::Session;
use crate::side::{self, side_err, ServerKeys, SideChannel};
use crate::wake::WakeSet;

fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// True if a bound endpoint's host is unspecified (`0.0.0.0`, `::`, `*`).
fn is_wildcard(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => a.is_unspecified(),
        Ok(std::net::IpAddr::V6(a)) => {
            a.is_unspecified() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
        }
        Err(_) => host == "*",
    }
}

impl VerbsTransport<IbvDevice> {
    /// Opens the configured device port.
    pub fn open(config: &VerbsConfig) -> Result<Self, VerbsError> {
        let device = IbvDevice::open(&config.device, config.port)?;
        Self::with_device(device, config)
    }

    /// Opens the device with a pool of `len` bytes of its own (map it with
    /// [`pool_ptr`](Self::pool_ptr), then register it).
    pub fn with_pool(config: &VerbsConfig, len: usize) -> Result<Self, VerbsError> {
        let pool = HostPool::new(len).map_err(|source| VerbsError::Os {
            what: "map pool",
            source,
        })?;
        let mut t = Self::open(config)?;
        t.pool = Some(pool);
        Ok(t)
    }
}

impl<D: Device> VerbsTransport<D> {
    /// A transport over an opened device with a pool of `len` bytes of its
    /// own, as [`with_pool`](VerbsTransport::with_pool) opens one over a
    /// real device (a test stand-in's runtime tests take this).
    pub fn with_device_and_pool(
        device: D,
        config: &VerbsConfig,
        len: usize,
    ) -> Result<Self, VerbsError> {
        let pool = HostPool::new(len).map_err(|source| VerbsError::Os {
            what: "map pool",
            source,
        })?;
        let mut t = Self::with_device(device, config)?;
        t.pool = Some(pool);
        Ok(t)
    }

    /// A transport over an opened device (a real one, or a test stand-in).
    pub fn with_device(device: D, config: &VerbsConfig) -> Result<Self, VerbsError> {
        let port = device.port().clone();
        let gid =
            choose(port.link, device.gid_table(), config.gid).map_err(|why| VerbsError::NoGid {
                device: port.device.clone(),
                port: port.port,
                why,
            })?;
        let listen = match &config.listen {
            Some(l) if l.contains("://") => l.clone(),
            Some(host) if host.contains(':') && !host.starts_with('[') => {
                format!("tcp://[{host}]:*")
            }
            Some(host) => format!("tcp://{host}:*"),
            None => match ipv4_of(&gid.gid) {
                Some(ip) => format!("tcp://{ip}:*"),
                None => {
                    return Err(VerbsError::Port {
                        device: port.device.clone(),
                        port: port.port,
                        why: format!(
                            "GID {} (index {}) has no IPv4 address to run the side channel on; name one with --verbs-listen",
                            gid_text(&gid.gid),
                            gid.index
                        ),
                    })
                }
            },
        };
        let incarnation = random_u64();
        let guard = config.guard()?;
        let ctx = zmq::Context::new();
        let zap = guard.start(&ctx).map_err(|e| VerbsError::Guard {
            peer: None,
            source: e,
        })?;
        let router = ctx
            .socket(zmq::ROUTER)
            .map_err(|e| side_err("create the ROUTER socket", None, e))?;
        guard
            .server(&router, &listen)
            .map_err(|e| VerbsError::Guard {
                peer: None,
                source: e,
            })?;
        router
            .set_linger(0)
            .map_err(|e| side_err("set LINGER", None, e))?;
        router
            .set_ipv6(listen.contains('['))
            .map_err(|e| side_err("set IPV6", None, e))?;
        // Before the bind, so that every connection has them: a peer that
        // sends a frame larger than an exchange message is dropped by
        // libzmq instead of buffered whole, and one that sends many
        // requests waits for them to be answered.
        router
            .set_maxmsgsize(side::MAX_FRAME)
            .map_err(|e| side_err("set MAXMSGSIZE", None, e))?;
        router
            .set_rcvhwm(side::ROUTER_RCVHWM)
            .map_err(|e| side_err("set RCVHWM", None, e))?;
        router
            .bind(&listen)
            .map_err(|e| side_err("bind the side channel", None, e))?;
        let endpoint = router
            .get_last_endpoint()
            .map_err(|e| side_err("read the bound endpoint", None, e))?
            .map_err(|_| side_err("read the bound endpoint", None, zmq::Error::EINVAL))?;
        let key = guard.curve.as_ref().map(|c| *c.key.public());
        let session = Session {
            incarnation,
            generation: 0,
            endpoint: endpoint.clone(),
            key,
        };
        // Peers dial what the session names, so it must be an address of
        // this host, not a wildcard.
        if is_wildcard(&endpoint) {
            return Err(VerbsError::Port {
                device: port.device.clone(),
                port: port.port,
                why: format!("the side channel bound {endpoint}, which peers cannot dial; listen on an address of this host"),
            });
        }
        let session = Session::parse(&session.to_string())?.to_string();
        let inproc = format!("inproc://ferry-verbs-wake-{incarnation:016x}");
        let wake_rx = wake_end(&ctx, zmq::PULL, &inproc)?;
        let wake_tx = wake_end(&ctx, zmq::PUSH, &inproc)?;
        let limits = ConnLimits {
            // One send-queue slot stays free for the marker that ends the
            // queue pair (`conn::end`).
            send_depth: config
                .send_depth
                .clamp(2, port.max_qp_wr.saturating_sub(1).max(2)),
            max_chunk: config
                .max_chunk
                .map_or(port.max_msg, |c| c.clamp(1, port.max_msg)),
            write_timeout: config.write_timeout,
            connect_timeout: config.connect_timeout,
            max_writers: config.max_writers,
            max_per_writer: config.max_per_writer,
        };
        let events = Arc::new(WakeSet::new(device.completion_fd())?);
        let book = Arc::new(Mutex::new(ConnBook::new(
            device,
            session.clone(),
            incarnation,
            (gid.index, gid.gid),
            limits,
        )));
        let stop = Arc::new(AtomicBool::new(false));
        let server_keys = Arc::new(ServerKeys::default());
        let zap = zap.map(Arc::new);
        let thread = side::spawn(
            SideChannel {
                ctx,
                router,
                wake: wake_rx,
                guard,
                tcp: endpoint.starts_with("tcp://"),
                server_keys: Arc::clone(&server_keys),
                _zap: zap.clone(),
            },
            Arc::clone(&book),
            Arc::clone(&events),
            Arc::clone(&stop),
        )?;
        tracing::info!(
            session = %session,
            device = %port.device,
            port = port.port,
            gid_index = gid.index,
            gid = %gid_text(&gid.gid),
            mtu = port.active_mtu,
            max_chunk = limits.max_chunk,
            "verbs transport open"
        );
        Ok(Self {
            session,
            endpoint,
            thread: Some(thread),
            stop,
            wake: Mutex::new(wake_tx),
            events,
            book,
            next_sweep: Instant::now(),
            write_lifetime: config.write_timeout.saturating_add(crate::conn::FLUSH_WAIT),
            server_keys,
            key,
            zap,
            pool: None,
        })
    }
}

/// One end of the inproc pipe that wakes the side channel's thread: the
/// receiving end (`zmq::PULL`) binds `inproc`, the sending one connects
/// to it. LINGER 0 on both ends: an unread wake-up must never hold the
/// context open at drop.
fn wake_end(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    inproc: &str,
) -> Result<zmq::Socket, VerbsError> {
    let socket = ctx
        .socket(kind)
        .map_err(|e| side_err("create the wake socket", None, e))?;
    socket
        .set_linger(0)
        .map_err(|e| side_err("set LINGER", None, e))?;
    if matches!(kind, zmq::PULL) {
        socket
            .bind(inproc)
            .map_err(|e| side_err("bind the wake socket", None, e))?;
    } else {
        socket
            .connect(inproc)
            .map_err(|e| side_err("connect the wake socket", None, e))?;
    }
    Ok(socket)
}
