//! [`VerbsTransport`]: tensorferry-core's `Transport` over RC queue pairs.
//!
//! One device port, one protection domain, one completion queue and one
//! registered pool per transport. The first write to (or read from) a peer
//! session makes a connection through the side channel; writes and reads
//! are split at the port's maximum message and posted within a bounded
//! window on that connection's queue pair; the caller's `poll_completion`
//! reaps the CQ and enforces deadlines.

#![allow(unsafe_code)] // Registration: the caller keeps the memory mapped.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tensorferry_core::transport::{
    Capabilities, Completion, ReadOp, Region, RegionError, Transport, WriteOp,
};
use tensorferry_hostmem::HostPool;
use tensorferry_zmq::{CurveConfig, CurveKeyPair, CurvePublicKey, Guard, ZapHandler};

use crate::conn::{ConnBook, ConnLimits, ConnState, RegisteredRegion, FLUSH_WAIT};
use crate::device::{Device, PortInfo, RdmaOp};
use crate::error::VerbsError;
use crate::exchange::MAX_REGIONS;
use crate::gid::{choose, gid_text, ipv4_of, GidChoice};
use crate::ibv::IbvDevice;
use crate::session::Session;
use crate::side::{self, side_err, ServerKeys, SideChannel};
use crate::wake::WakeSet;

/// How often the caller's poll checks write and connect deadlines.
const SWEEP: Duration = Duration::from_millis(5);

/// How long a caller waiting for queue pairs to end sleeps between polls
/// (with the book unlocked, so that the side channel goes on).
const END_POLL: Duration = Duration::from_micros(50);

/// What a verbs transport opens and how it behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// The RDMA device (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Its port (from 1).
    pub port: u8,
    /// The local GID index.
    pub gid: GidChoice,
    /// Where the side channel listens: a host address of this machine
    /// (`10.0.0.2`, port picked by the OS) or a full ZeroMQ endpoint
    /// (`tcp://10.0.0.2:7000`). Default: the IPv4 address of the chosen
    /// GID (RoCE), which peers reach over the same network.
    pub listen: Option<String>,
    /// Largest work request (default and ceiling: the port's maximum
    /// message).
    pub max_chunk: Option<u32>,
    /// Outstanding work requests per queue pair (at most one less than
    /// the device's `max_qp_wr`: the send queue keeps a slot for the
    /// marker that ends it).
    pub send_depth: u32,
    /// A write (or read) not completed after this fails (keep it below
    /// the coordinator's push timeout).
    pub write_timeout: Duration,
    /// A connection exchange not answered after this fails its transfers.
    pub connect_timeout: Duration,
    /// Writers whose queue pairs a target keeps (the oldest is dropped
    /// beyond this).
    pub max_writers: usize,
    /// Addresses that may connect to the side channel over `tcp://` (the
    /// node's `--allow-from`); empty: any.
    pub allow_from: Vec<std::net::IpAddr>,
    /// The node's CURVE key pair: with it the side channel is a CURVE
    /// server that admits only `writers`, its public key travels in the
    /// session id, and this transport connects to CURVE side channels as a
    /// client. Without it, the side channel is plain.
    pub curve_key: Option<CurveKeyPair>,
    /// The public keys of the transports that may connect to write into
    /// this one, or read from it: a connected peer may do both (with
    /// `curve_key`).
    pub writers: Vec<CurvePublicKey>,
}

impl VerbsConfig {
    /// Defaults for `device`: port 1, automatic GID, 128 outstanding work
    /// requests, 5 s write timeout, 2 s connect timeout, 4096 writers.
    pub fn new(device: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            port: 1,
            gid: GidChoice::Auto,
            listen: None,
            max_chunk: None,
            send_depth: 128,
            write_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_writers: 4096,
            allow_from: Vec::new(),
            curve_key: None,
            writers: Vec::new(),
        }
    }

    /// What the side channel enforces, as [`Guard`] says it.
    fn guard(&self) -> Result<Guard, VerbsError> {
        if self.curve_key.is_none() && !self.writers.is_empty() {
            return Err(VerbsError::Port {
                device: self.device.clone(),
                port: self.port,
                why: "writers' CURVE keys are given, but no key of this node's (--curve-key) for its side channel to serve with".into(),
            });
        }
        Ok(Guard {
            allow: self.allow_from.clone(),
            curve: self.curve_key.clone().map(|key| CurveConfig {
                key,
                peers: self.writers.clone(),
            }),
        })
    }
}

/// ferry's ibverbs transport (see the module documentation).
pub struct VerbsTransport<D: Device = IbvDevice> {
    session: String,
    endpoint: String,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    wake: Mutex<zmq::Socket>,
    events: Arc<WakeSet>,
    book: Arc<Mutex<ConnBook<D>>>,
    next_sweep: Instant,
    /// The id the next registered region gets.
    next_region: u32,
    /// The side channel key of each endpoint this transport connects to,
    /// from the session ids it writes to (read by the side channel's
    /// thread when it connects).
    server_keys: Arc<ServerKeys>,
    /// The side channel's public key, if it is a CURVE server.
    key: Option<CurvePublicKey>,
    /// The side channel's guard, shared with its thread (which drops its
    /// socket first, and is joined before this is dropped).
    zap: Option<Arc<ZapHandler>>,
    // Last: unmapped after the registration (inside the book) is gone.
    pool: Option<HostPool>,
}

impl<D: Device> std::fmt::Debug for VerbsTransport<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

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
        let wake_rx = ctx
            .socket(zmq::PULL)
            .map_err(|e| side_err("create the wake socket", None, e))?;
        // LINGER 0 on both ends: an unread wake-up must never hold the
        // context open at drop.
        wake_rx
            .set_linger(0)
            .map_err(|e| side_err("set LINGER", None, e))?;
        wake_rx
            .bind(&inproc)
            .map_err(|e| side_err("bind the wake socket", None, e))?;
        let wake_tx = ctx
            .socket(zmq::PUSH)
            .map_err(|e| side_err("create the wake socket", None, e))?;
        wake_tx
            .set_linger(0)
            .map_err(|e| side_err("set LINGER", None, e))?;
        wake_tx
            .connect(&inproc)
            .map_err(|e| side_err("connect the wake socket", None, e))?;
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
            next_region: 1,
            server_keys,
            key,
            zap,
            pool: None,
        })
    }

    fn book(&self) -> MutexGuard<'_, ConnBook<D>> {
        side::lock(&self.book)
    }

    /// A region came or went: the session id's generation moves on, so
    /// that writers connect again and learn the regions anew.
    fn regions_changed(&mut self) {
        let session = {
            let mut book = self.book();
            let session = Session {
                incarnation: book.incarnation,
                generation: book.generation.wrapping_add(1),
                endpoint: self.endpoint.clone(),
                key: self.key,
            };
            book.generation = session.generation;
            book.me = session.to_string();
            book.me.clone()
        };
        self.session = session;
    }

    fn wake_side(&self) {
        let s = self
            .wake
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A full pipe already holds a wake-up.
        let _ = s.send(&b"w"[..], zmq::DONTWAIT);
    }

    /// The pool's first byte (null without a pool).
    ///
    /// The pool stays mapped, at this address, for as long as the
    /// transport lives and is released only by its drop: ferry's runtime
    /// relies on it (`tensorferry::runtime::PoolOwner`), so no method may unmap
    /// or replace it.
    pub fn pool_ptr(&self) -> *mut u8 {
        self.pool
            .as_ref()
            .map_or(std::ptr::null_mut(), HostPool::ptr)
    }

    /// The pool's length (0 without a pool).
    pub fn pool_len(&self) -> usize {
        self.pool.as_ref().map_or(0, HostPool::len)
    }

    /// The side channel's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Connections to the side channel its guard refused so far (by
    /// address or CURVE key; a connection without CURVE to a CURVE side
    /// channel is refused by libzmq before the guard sees it).
    pub fn refused(&self) -> u64 {
        self.zap.as_ref().map_or(0, |z| z.refused())
    }

    /// The opened port.
    pub fn port(&self) -> PortInfo {
        self.book().device.port().clone()
    }

    /// The local GID index and GID in use.
    pub fn gid(&self) -> (u8, [u8; 16]) {
        self.book().gid
    }

    /// The state of the connection to `peer`, if there is one.
    pub fn connection(&self, peer: &str) -> Option<ConnState> {
        self.book().state_of(peer)
    }

    /// Waits until no connection to `peer` (to anyone, for `None`) is
    /// ending: every work request its queue pair held has completed, and
    /// its transfers' completions are queued. Past [`FLUSH_WAIT`] the ones
    /// left go by the last resort (their queue pairs destroyed).
    fn wait_ended(&self, peer: Option<&str>) {
        let deadline = Instant::now() + FLUSH_WAIT;
        loop {
            {
                let mut book = self.book();
                book.progress_ends();
                if !book.ending(peer) {
                    break;
                }
                if Instant::now() >= deadline {
                    book.abandon_ending(peer);
                    break;
                }
            }
            std::thread::sleep(END_POLL);
        }
        // Completions are queued: a caller waiting on the wake descriptor
        // looks.
        self.events.signal();
    }

    /// Queues a write or read of `len` bytes at `local_offset` in the local
    /// `region` (checked here), to or from `remote_addr` at the peer.
    fn post(
        &mut self,
        op: RdmaOp,
        region: Region,
        (local_offset, len): (u64, u64),
        peer: &str,
        remote_addr: u64,
        cookie: u64,
    ) -> Result<(), VerbsError> {
        let fresh = {
            let mut book = self.book();
            let local = match book.regions.iter().find(|p| p.region == region.id) {
                Some(&p) => p,
                None => return Err(RegionError::Unknown(region.id).into()),
            };
            // A write's source and a read's destination: the same bounds.
            Region {
                id: local.region,
                addr: local.addr,
                len: local.len,
            }
            .check_source(local_offset, len)?;
            let fresh = book.post(
                op,
                peer,
                (local.addr + local_offset, local.keys.lkey),
                len,
                remote_addr,
                cookie,
            )?;
            if fresh {
                // Under the book's lock, so that the side channel's thread,
                // which starts the connection under it, finds the key.
                self.server_keys.note(peer);
            }
            fresh
        };
        if fresh {
            self.wake_side();
        }
        Ok(())
    }

    /// Runs `f` on the device (tests drive their stand-in through this).
    pub fn with_device_mut<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.book().device)
    }
}

impl<D: Device> Drop for VerbsTransport<D> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake_side();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<D: Device> Transport for VerbsTransport<D> {
    type Error = VerbsError;

    fn session_id(&self) -> &str {
        &self.session
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Writes are split at the port's maximum message.
            max_write: u64::MAX,
            // An RC write completes when the target's NIC has acknowledged
            // it; the target reads only after the commit, a control message
            // sent after that completion (the ordering Mooncake and sglang
            // rely on too).
            delivery_complete: true,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, VerbsError> {
        let mut book = self.book();
        if book.regions.len() >= MAX_REGIONS {
            return Err(RegionError::TooMany { max: MAX_REGIONS }.into());
        }
        // SAFETY: the caller's contract: the memory stays mapped until
        // deregistered or the transport dropped.
        let keys = unsafe { book.device.register(addr as u64, len) }.map_err(VerbsError::from)?;
        let region = Region {
            id: self.next_region,
            addr: addr as u64,
            len: len as u64,
        };
        book.regions.push(RegisteredRegion {
            region: region.id,
            addr: region.addr,
            len: region.len,
            keys,
        });
        drop(book);
        self.next_region += 1;
        self.regions_changed();
        Ok(region)
    }

    fn deregister(&mut self, region: Region) -> Result<(), VerbsError> {
        let mut book = self.book();
        if !book.regions.iter().any(|p| p.region == region.id) {
            return Err(RegionError::Unknown(region.id).into());
        }
        // Posted work may name the region: its connections end (and
        // reconnect on next use) before the registration goes.
        book.end_all("a registered region was deregistered");
        drop(book);
        self.wait_ended(None);
        let mut book = self.book();
        // Only this caller (`&mut self`) changes the regions.
        let i = book
            .regions
            .iter()
            .position(|p| p.region == region.id)
            .ok_or(RegionError::Unknown(region.id))?;
        let gone = book.regions.remove(i);
        book.device.deregister(gone.keys);
        drop(book);
        self.regions_changed();
        Ok(())
    }

    /// Posts an RDMA READ on the connection to `src_session` (made on
    /// first use, as a write's is): chunked, windowed, timed out (by the
    /// write timeout), failed and cancelled as writes are, on the same
    /// queue pair. The local region is checked here; the source against
    /// the regions the peer listed (at once when they are known, when the
    /// first chunk goes otherwise).
    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), VerbsError> {
        let ReadOp {
            region,
            local_offset,
            len,
            src_session,
            src_addr,
            cookie,
        } = *read;
        self.post(
            RdmaOp::Read,
            region,
            (local_offset, len),
            src_session,
            src_addr,
            cookie,
        )
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), VerbsError> {
        let WriteOp {
            region,
            local_offset,
            len,
            dest_session,
            dest_addr,
            cookie,
            ..
        } = *write;
        self.post(
            RdmaOp::Write,
            region,
            (local_offset, len),
            dest_session,
            dest_addr,
            cookie,
        )
    }

    fn poll_completion(&mut self) -> Option<Completion<VerbsError>> {
        // Cleared before looking, so news that comes after signals anew.
        self.events.clear();
        let mut book = side::lock(&self.book);
        if let Some(c) = book.poll() {
            return Some(c);
        }
        // Nothing finished: the caller is about to wait, so this is when
        // the clock is read (not once per completion) and deadlines kept.
        let now = Instant::now();
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP;
            if let Some(c) = book.sweep(now) {
                return Some(c);
            }
        }
        if book.needs_polling() {
            self.events.signal();
        }
        None
    }

    /// Stops the queue pair to the peer (ERR), drops its writes and reads
    /// not yet posted, and waits until the marker posted after the ERR
    /// completes: every work request before it has then completed, flushed
    /// or done, so none moves a byte any more (a flushed READ places
    /// nothing). Transfers that finished complete as they did; the others
    /// as [`VerbsError::Cancelled`]. A queue pair whose marker does not
    /// come within a second is destroyed instead. The next transfer with
    /// the peer connects anew.
    fn cancel_transfers(&mut self, session: &str) -> Result<(), VerbsError> {
        self.book().cancel(session);
        self.wait_ended(Some(session));
        Ok(())
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.events.fd())
    }
}
