//! The libfabric `Transport`: one RDM endpoint, one registered pool, RMA
//! writes into peers' pools, and a progress thread.
//!
//! Threads. The runtime posts writes from its own thread; a progress thread
//! owned by the transport reads the completion queue (sleeping in
//! `fi_cq_sread` where the provider has a wait object). It is needed even
//! when this side only receives: manual-progress providers (`tcp;ofi_rxm`,
//! `shm`) place incoming data only while the target's queue is driven.
//! The domain is opened `FI_THREAD_SAFE`, so both threads call libfabric
//! directly.
//!
//! Delivery. [`Delivery::Complete`] posts every write with
//! `FI_DELIVERY_COMPLETE`: its completion means the bytes are at the
//! target. [`Delivery::Notify`] posts every chunk with remote CQ data that
//! the receiver counts ([`crate::notice`]); its
//! [`Transport::poll_landed`] reports each write whose count is complete.
#![allow(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferry_core::transport::{Capabilities, Completion, Landed, Region, Transport, WriteOp};
use ferry_fabric_sys as sys;
use tracing::{debug, warn};

use crate::error::FabricError;
use crate::mr::MrPolicy;
use crate::notice::{NoticeBook, NoticeFormat};
use crate::ofi::{Av, Cq, Domain, Endpoint, Fabric, Info, MemoryRegion};
use crate::provider::{Delivery, Hints, Provider};
use crate::session::{RemoteRegion, Session, MAX_REGIONS};
use ferry_hostmem::HostPool;

/// How often late writes are looked for.
const SWEEP: Duration = Duration::from_millis(5);

/// Peers remembered before the idle ones are forgotten.
const MAX_PEERS: usize = 4096;

/// How to open a libfabric transport.
#[derive(Clone, Debug)]
pub struct FabricConfig {
    /// Which provider.
    pub provider: Provider,
    /// How delivery is made sure of before a receiver is told to read.
    pub delivery: Delivery,
    /// An address of this host to bind to (`fi_getinfo` node with
    /// `FI_SOURCE`), to pick the interface; `None`: the provider's choice
    /// (for `tcp`, `FI_TCP_IFACE` also picks it).
    pub source: Option<String>,
    /// Largest chunk a write is split into; 0: the provider's
    /// `max_msg_size`.
    pub max_chunk: u64,
    /// Chunks in flight at once (each needs an operation context).
    pub max_outstanding: usize,
    /// A write that neither completes nor fails within this is reported
    /// failed, and its peer dropped (closing the connection, so that the
    /// write cannot land later). Keep it below the coordinator's push
    /// timeout (10 s by default).
    pub write_timeout: Duration,
}

impl FabricConfig {
    /// Defaults for `provider`.
    pub fn new(provider: Provider) -> Self {
        Self {
            provider,
            delivery: Delivery::Auto,
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
    pub delivery: Delivery,
    /// The registration rules.
    pub mr: MrPolicy,
    /// The chunk size writes are split at.
    pub chunk: u64,
    /// True if the progress thread can sleep in `fi_cq_sread`.
    pub waitable_cq: bool,
}

/// A peer's pool, resolved once per session id.
struct Peer {
    fi_addr: sys::fi_addr_t,
    session: Session,
    name: Arc<str>,
}

struct WriteState {
    cookie: u64,
    /// Chunks posted and not yet completed.
    in_flight: u32,
    /// Chunks waiting in the backlog to be posted.
    queued: u32,
    error: Option<FabricError>,
    peer: Arc<str>,
    posted: Instant,
    deadline: Instant,
    /// Reported to the runtime already (timed out).
    reported: bool,
}

/// One chunk waiting to be posted: the queue was full (`-FI_EAGAIN`, which
/// is also what a peer that cannot be reached yet answers) or every context
/// was in use.
struct Chunk {
    write: u32,
    /// The source region (its id), whose deregistration fails the chunk.
    region: u32,
    local: usize,
    len: usize,
    desc: usize,
    dest: sys::fi_addr_t,
    remote: u64,
    key: u64,
    data: u64,
    flags: u64,
}

/// Completion bookkeeping shared by the posting and the progress thread.
struct Book {
    backlog: VecDeque<Chunk>,
    free_ctx: Vec<u32>,
    /// Context index → write slot.
    ctx_owner: Vec<u32>,
    writes: Vec<Option<WriteState>>,
    free_writes: Vec<u32>,
    done: VecDeque<Completion<FabricError>>,
    notices: NoticeBook,
    /// Peers whose writes failed as gone or timed out: removed from the
    /// address vector (closing the connection) by the runtime's thread, at
    /// its next post or poll.
    evict: Vec<Arc<str>>,
    /// Held by a test: the progress thread stops driving the queue.
    held: bool,
    /// A completion or notice arrived since the wake descriptor was last
    /// signalled.
    news: bool,
}

impl Book {
    /// One chunk of write `w` finished (with `err` if it failed).
    fn chunk_done(&mut self, w: u32, err: Option<FabricError>) {
        let Some(Some(ws)) = self.writes.get_mut(w as usize) else {
            return;
        };
        ws.in_flight = ws.in_flight.saturating_sub(1);
        if ws.error.is_none() {
            ws.error = err;
        }
        self.finish_if_done(w);
    }

    fn finish_if_done(&mut self, w: u32) {
        let Some(Some(ws)) = self.writes.get(w as usize) else {
            return;
        };
        if ws.in_flight > 0 || ws.queued > 0 {
            return;
        }
        let Some(ws) = self.writes[w as usize].take() else {
            return;
        };
        self.free_writes.push(w);
        if ws.reported {
            return;
        }
        if let Some(e) = &ws.error {
            if matches!(
                ferry_core::transport::Fault::kind(e),
                ferry_core::transport::FaultKind::PeerGone
            ) {
                self.evict.push(Arc::clone(&ws.peer));
            }
        }
        debug!(
            cookie = ws.cookie,
            took_us = ws.posted.elapsed().as_micros() as u64,
            ok = ws.error.is_none(),
            "write done"
        );
        self.done.push_back(Completion {
            cookie: ws.cookie,
            result: ws.error.map_or(Ok(()), Err),
        });
        self.news = true;
    }

    /// Fails the writes past their deadline; returns how many.
    fn expire(&mut self, now: Instant, timeout: Duration) -> usize {
        let mut expired = 0;
        for ws in self.writes.iter_mut().flatten() {
            if !ws.reported && now >= ws.deadline {
                expired += 1;
                ws.reported = true;
                // A write that may still land must not land later, into a
                // slot given to another request: drop the peer, which
                // closes the provider's connection to it.
                self.evict.push(Arc::clone(&ws.peer));
                self.done.push_back(Completion {
                    cookie: ws.cookie,
                    result: Err(FabricError::Timeout {
                        peer: ws.peer.to_string(),
                        after: timeout,
                    }),
                });
                self.news = true;
            }
        }
        expired
    }
}

/// Operation contexts handed to the provider: `FI_CONTEXT2` space each,
/// written by the provider only.
struct Contexts(Box<[std::cell::UnsafeCell<sys::fi_context2>]>);

// SAFETY: the cells are only written by the provider, through pointers
// handed out for one in-flight operation each (the free list in `Book`
// guarantees exclusivity); Rust code never reads or writes them.
unsafe impl Sync for Contexts {}
// SAFETY: as above.
unsafe impl Send for Contexts {}

impl Contexts {
    fn ptr(&self, i: u32) -> *mut c_void {
        self.0[i as usize].get().cast()
    }

    fn index(&self, p: *mut c_void) -> Option<u32> {
        let base = self.0.as_ptr() as usize;
        let size = std::mem::size_of::<sys::fi_context2>();
        let off = (p as usize).checked_sub(base)?;
        if off % size != 0 {
            return None;
        }
        let i = off / size;
        (i < self.0.len()).then_some(i as u32)
    }
}

struct Shared {
    cq: Arc<Cq>,
    /// An eventfd, readable while the runtime has news to collect.
    wake: WakeFd,
    book: Mutex<Book>,
    stop: AtomicBool,
    /// When the progress thread last went round its loop, in ms since
    /// `born`: a provider call that never returns shows here.
    beat: AtomicU64,
    born: Instant,
    contexts: Contexts,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Posts what the backlog holds, in order, as far as contexts and the
    /// provider's queue allow; returns true if chunks remain. The book is
    /// not held while a chunk is posted: a provider may spin inside the
    /// call (shm waits for its peer's queue lock), and completions must go
    /// on being recorded meanwhile.
    fn drain(&self, endpoint: &Endpoint) -> bool {
        let mut tries = self.lock().backlog.len();
        while tries > 0 {
            tries -= 1;
            // Take a chunk and a context, and count the chunk in flight
            // before posting, so that a completion read at once finds it.
            let (c, ctx) = {
                let mut book = self.lock();
                let Some(c) = book.backlog.pop_front() else {
                    break;
                };
                let live = book
                    .writes
                    .get(c.write as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|ws| ws.error.is_none() && !ws.reported);
                if !live {
                    // Its write failed or timed out: the chunk is not posted.
                    if let Some(ws) = book
                        .writes
                        .get_mut(c.write as usize)
                        .and_then(Option::as_mut)
                    {
                        ws.queued -= 1;
                    }
                    book.finish_if_done(c.write);
                    continue;
                }
                let Some(ctx) = book.free_ctx.pop() else {
                    book.backlog.push_front(c);
                    break;
                };
                book.ctx_owner[ctx as usize] = c.write;
                if let Some(ws) = book
                    .writes
                    .get_mut(c.write as usize)
                    .and_then(Option::as_mut)
                {
                    ws.queued -= 1;
                    ws.in_flight += 1;
                }
                (c, ctx)
            };
            // SAFETY: the chunk lies in the registered region (checked when
            // it was queued; deregistering fails the backlog first), and
            // the context cell is reserved for it until its completion.
            let ret = unsafe {
                endpoint.write(
                    c.local as *const u8,
                    c.len,
                    c.desc as *mut c_void,
                    c.dest,
                    c.remote,
                    c.key,
                    c.data,
                    c.flags,
                    self.contexts.ptr(ctx),
                )
            };
            if ret >= 0 {
                continue;
            }
            // Not posted, so no completion comes: undo.
            let mut book = self.lock();
            book.ctx_owner[ctx as usize] = u32::MAX;
            book.free_ctx.push(ctx);
            let w = c.write;
            let Some(ws) = book.writes.get_mut(w as usize).and_then(Option::as_mut) else {
                continue;
            };
            ws.in_flight -= 1;
            if ret == -(sys::FI_EAGAIN as isize) {
                ws.queued += 1;
                book.backlog.push_back(c);
                continue;
            }
            if let Err(e) = crate::ofi::check(crate::error::Call::WriteMsg, ret, Some(&ws.peer)) {
                if ws.error.is_none() {
                    ws.error = Some(e);
                }
            }
            book.finish_if_done(w);
        }
        !self.lock().backlog.is_empty()
    }

    /// Fails every queued chunk from `region` (it is going away); the
    /// others stay queued.
    fn fail_backlog(&self, region: u32, why: &str) {
        let mut book = self.lock();
        let (gone, kept): (VecDeque<Chunk>, VecDeque<Chunk>) = std::mem::take(&mut book.backlog)
            .into_iter()
            .partition(|c| c.region == region);
        book.backlog = kept;
        for c in gone {
            if let Some(ws) = book
                .writes
                .get_mut(c.write as usize)
                .and_then(Option::as_mut)
            {
                ws.queued -= 1;
                if ws.error.is_none() {
                    ws.error = Some(FabricError::Call {
                        call: crate::error::Call::WriteMsg,
                        errno: sys::FI_ECANCELED as i32,
                        text: why.to_owned(),
                        peer: Some(ws.peer.to_string()),
                    });
                }
            }
            book.finish_if_done(c.write);
        }
    }

    fn handle(&self, entries: &[sys::fi_cq_data_entry]) {
        let now = Instant::now();
        let mut book = self.lock();
        for e in entries {
            if e.flags & u64::from(sys::FI_REMOTE_CQ_DATA) != 0 {
                book.notices.record(e.data, now);
                book.news = true;
                continue;
            }
            let Some(i) = self.contexts.index(e.op_context) else {
                debug!(flags = e.flags, "completion for no context of ours");
                continue;
            };
            let w = std::mem::replace(&mut book.ctx_owner[i as usize], u32::MAX);
            book.free_ctx.push(i);
            book.chunk_done(w, None);
        }
    }

    fn handle_error(&self, e: &sys::fi_cq_err_entry, text: String) {
        let mut book = self.lock();
        let Some(i) = self.contexts.index(e.op_context) else {
            warn!(errno = e.err, prov_errno = e.prov_errno, %text, "completion error for no write of ours");
            return;
        };
        let w = std::mem::replace(&mut book.ctx_owner[i as usize], u32::MAX);
        book.free_ctx.push(i);
        let peer = book
            .writes
            .get(w as usize)
            .and_then(|s| s.as_ref())
            .map_or_else(String::new, |s| s.peer.to_string());
        warn!(%peer, errno = e.err, prov_errno = e.prov_errno, %text, "write failed");
        book.chunk_done(
            w,
            Some(FabricError::Completion {
                peer,
                errno: e.err,
                prov_errno: e.prov_errno,
                text,
            }),
        );
    }

    /// The progress thread: drive the queue, post the backlog, hand
    /// completions over, expire late writes.
    /// Write deadlines are kept by the runtime's side
    /// (`FabricTransport::poll_completion`), which goes on even when a
    /// provider call here never returns.
    fn run(&self, endpoint: &Endpoint) {
        let mut buf = [sys::fi_cq_data_entry::default(); 64];
        let mut last_work = Instant::now();
        let mut last_prune = Instant::now();
        // After work, poll a little before sleeping: the next event of a
        // busy stream is usually that close.
        let spin = Duration::from_micros(50);
        while !self.stop.load(Ordering::Acquire) {
            self.beat
                .store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
            let now = Instant::now();
            let (held, news, queued) = {
                let mut book = self.lock();
                if now.duration_since(last_prune) >= Duration::from_secs(1) {
                    last_prune = now;
                    book.notices.prune(now);
                }
                let news = std::mem::take(&mut book.news);
                (book.held, news, !book.backlog.is_empty())
            };
            if news {
                self.wake.signal();
            }
            if held {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let backlog = queued && self.drain(endpoint);
            let idle = now.duration_since(last_work) >= spin;
            let r = if idle && self.cq.waitable() && !backlog {
                self.cq.sread(&mut buf, 5)
            } else {
                self.cq.read(&mut buf)
            };
            match r {
                Ok(0) => {
                    if idle && (backlog || !self.cq.waitable()) {
                        std::thread::sleep(Duration::from_micros(20));
                    } else {
                        std::hint::spin_loop();
                    }
                }
                // What they bring is announced at the top of the loop.
                Ok(n) => {
                    last_work = Instant::now();
                    self.handle(&buf[..n]);
                }
                Err(errno) if errno == sys::FI_EAVAIL as i32 => {
                    last_work = Instant::now();
                    if let Some((e, text)) = self.cq.read_err() {
                        self.handle_error(&e, text);
                    }
                }
                Err(errno) => {
                    warn!(errno, error = %crate::ofi::strerror(errno), "fi_cq_read failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// What the progress thread's silence means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stall {
    /// It went round its loop lately (or is held on purpose).
    None,
    /// It is inside one provider call for longer than the write timeout,
    /// and no write failed for it: a provider may rightly copy a window of
    /// large writes inside one queue read. Not a fault.
    Long,
    /// Writes timed out while it was silent: said once, as an error.
    Failing,
    /// It came back after `Failing` was said.
    Back,
}

fn stall(silent: Duration, timeout: Duration, held: bool, expired: usize, reported: bool) -> Stall {
    let stuck = silent > timeout && !held;
    match (stuck, reported) {
        (true, false) if expired > 0 => Stall::Failing,
        (true, _) => Stall::Long,
        (false, true) => Stall::Back,
        (false, false) => Stall::None,
    }
}

/// A libfabric data plane.
pub struct FabricTransport {
    // Field order is drop order: the regions close before the endpoint,
    // the endpoint before the operation contexts it may still use (in
    // `shared`) and before its queue, and all before the domain and the
    // pool.
    regions: Vec<(Region, MemoryRegion)>,
    next_region: u32,
    thread: Option<JoinHandle<()>>,
    endpoint: Arc<Endpoint>,
    shared: Arc<Shared>,
    av: Arc<Av>,
    domain: Arc<Domain>,
    pool: Option<HostPool>,
    peers: HashMap<String, Peer>,
    opened: Opened,
    session: String,
    notice_format: NoticeFormat,
    cq_data_size: usize,
    next_key: u64,
    write_timeout: Duration,
    /// The stuck progress thread was reported.
    stuck_reported: bool,
    /// When `poll_completion` next looks for late writes.
    next_sweep: Instant,
    _info: Info,
}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricTransport")
            .field("opened", &self.opened)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl FabricTransport {
    /// Opens a transport (no pool yet: [`register`](Transport::register)
    /// one, or use [`with_pool`](Self::with_pool)).
    pub fn open(config: &FabricConfig) -> Result<Self, FabricError> {
        let (info, delivery) = find(config)?;
        let provider = info.provider();
        if info.threading() != sys::fi_threading_FI_THREAD_SAFE {
            return Err(FabricError::Unsupported {
                provider,
                what: "does not grant FI_THREAD_SAFE".into(),
            });
        }
        let mr = MrPolicy::from_mode(info.mr_mode()).map_err(|what| FabricError::Unsupported {
            provider: provider.clone(),
            what,
        })?;
        let cq_data_size = info.cq_data_size();
        if delivery == Delivery::Notify && cq_data_size < 4 {
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
        let cq = Cq::open(&domain, (2 * outstanding).max(1024))?;
        let av = Av::open(&domain)?;
        let endpoint = Endpoint::open(&domain, &info, &cq, &av)?;
        let notice_format = NoticeFormat::new(cq_data_size >= 8);
        let opened = Opened {
            provider,
            fabric: info.fabric_name(),
            domain: info.domain_name(),
            delivery,
            mr,
            chunk,
            waitable_cq: cq.waitable(),
        };
        let wake = WakeFd::new()?;
        let shared = Arc::new(Shared {
            wake,
            cq,
            book: Mutex::new(Book {
                backlog: VecDeque::with_capacity(outstanding),
                free_ctx: (0..outstanding as u32).rev().collect(),
                ctx_owner: vec![u32::MAX; outstanding],
                writes: Vec::with_capacity(outstanding),
                free_writes: Vec::new(),
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
            let endpoint = Arc::clone(&endpoint);
            std::thread::Builder::new()
                .name("ferry-fabric".into())
                .spawn(move || shared.run(&endpoint))
                .map_err(|source| FabricError::Os {
                    what: "start the progress thread",
                    source,
                })?
        };
        let mut t = Self {
            regions: Vec::new(),
            next_region: 1,
            thread: Some(thread),
            shared,
            endpoint,
            av,
            domain,
            pool: None,
            peers: HashMap::new(),
            opened,
            session: String::new(),
            notice_format,
            cq_data_size,
            next_key: 1,
            write_timeout: config.write_timeout,
            stuck_reported: false,
            next_sweep: Instant::now(),
            _info: info,
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

    /// The pool's first byte (null without a pool).
    ///
    /// The pool stays mapped, at this address, for as long as the
    /// transport lives and is released only by its drop: ferry's runtime
    /// relies on it (`ferry::runtime::PoolOwner`), so no method may unmap
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

    /// What was opened.
    pub fn opened(&self) -> &Opened {
        &self.opened
    }

    /// Stops (`true`) or resumes the progress thread, as a stalled process
    /// would: this side then neither places incoming data (on
    /// manual-progress providers) nor reports completions. Tests use it to
    /// show what each completion level guarantees.
    pub fn hold_progress(&self, hold: bool) {
        self.shared.lock().held = hold;
        self.shared.cq.signal();
    }

    /// The session id over the regions registered now.
    fn session_text(&self) -> String {
        Session {
            provider: self.opened.provider.clone(),
            addr: self.endpoint.name().to_vec(),
            regions: self
                .regions
                .iter()
                .map(|(r, mr)| RemoteRegion {
                    key: mr.key(),
                    base: r.addr,
                    len: r.len,
                })
                .collect(),
            notify: self.opened.delivery == Delivery::Notify,
            virt_addr: self.opened.mr.virt_addr,
            wide_data: self.cq_data_size >= 8,
        }
        .encode()
    }

    /// Removes the peers whose writes failed or timed out, so that their
    /// connection closes and the next write reconnects. Only this thread
    /// touches the peer table and the address vector.
    fn evict_dead(&mut self) {
        let evict = {
            let mut book = self.shared.lock();
            if book.evict.is_empty() {
                return;
            }
            std::mem::take(&mut book.evict)
        };
        for name in evict {
            if let Some(p) = self.peers.remove(&*name) {
                warn!(peer = %name, "peer dropped after a failed write; its connection closes");
                self.av.remove(p.fi_addr);
            }
        }
    }

    fn peer(&mut self, session: &str) -> Result<&Peer, FabricError> {
        self.evict_dead();
        if !self.peers.contains_key(session) {
            let parsed = Session::parse(session).map_err(|why| FabricError::BadSession {
                session: session.to_owned(),
                why,
            })?;
            if parsed.provider != self.opened.provider {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: format!(
                        "it is a {} session; this transport runs {}",
                        parsed.provider, self.opened.provider
                    ),
                });
            }
            if parsed.regions.is_empty() {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: "the peer registered no memory".into(),
                });
            }
            if parsed.notify && self.cq_data_size < 4 {
                return Err(FabricError::BadSession {
                    session: session.to_owned(),
                    why: "the peer counts remote CQ data, which this provider cannot send".into(),
                });
            }
            if self.peers.len() >= MAX_PEERS {
                // Sessions of restarted peers pile up otherwise: forget the
                // peers no write is under way to.
                let busy: Vec<Arc<str>> = self
                    .shared
                    .lock()
                    .writes
                    .iter()
                    .flatten()
                    .map(|w| Arc::clone(&w.peer))
                    .collect();
                let idle: Vec<String> = self
                    .peers
                    .keys()
                    .filter(|k| !busy.iter().any(|b| &**b == k.as_str()))
                    .cloned()
                    .collect();
                for k in idle {
                    if let Some(p) = self.peers.remove(&k) {
                        self.av.remove(p.fi_addr);
                    }
                }
            }
            let fi_addr = self.av.insert(&parsed.addr, session)?;
            self.peers.insert(
                session.to_owned(),
                Peer {
                    fi_addr,
                    session: parsed,
                    name: Arc::from(session),
                },
            );
        }
        self.peers
            .get(session)
            .ok_or_else(|| FabricError::BadSession {
                session: session.to_owned(),
                why: "vanished from the peer table".into(),
            })
    }
}

/// Finds the first provider and delivery mode that `fi_getinfo` offers.
pub(crate) fn find(config: &FabricConfig) -> Result<(Info, Delivery), FabricError> {
    let mut why = Vec::new();
    for name in config.provider.candidates() {
        for &delivery in config.delivery.candidates() {
            match Info::get(&Hints::new(name, delivery), config.source.as_deref()) {
                Ok(info) => return Ok((info, delivery)),
                Err(e) => why.push(format!("{name} ({}): {e}", delivery.as_str())),
            }
        }
    }
    Err(FabricError::NoProvider {
        wanted: config.provider.to_string(),
        delivery: match config.delivery {
            Delivery::Auto => "",
            d => d.as_str(),
        },
        why: why.join("; "),
    })
}

impl Transport for FabricTransport {
    type Error = FabricError;

    fn session_id(&self) -> &str {
        &self.session
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_write: self
                .opened
                .chunk
                .saturating_mul(self.notice_format.max_chunks()),
            delivery_complete: self.opened.delivery == Delivery::Complete,
        }
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, FabricError> {
        if self.regions.len() >= MAX_REGIONS {
            return Err(FabricError::TooManyRegions { max: MAX_REGIONS });
        }
        let key = self.opened.mr.requested_key(self.next_key);
        self.next_key += 1;
        let ep = self.opened.mr.endpoint.then_some(&self.endpoint);
        // SAFETY: the caller's contract: the memory stays mapped until
        // deregistered or the transport dropped (the regions are dropped
        // first of all fields).
        let mr = unsafe { MemoryRegion::register(&self.domain, ep, addr, len, key)? };
        let region = Region {
            id: self.next_region,
            addr: addr as u64,
            len: len as u64,
        };
        self.next_region += 1;
        self.regions.push((region, mr));
        // Peers address every region through the session id, so it lists
        // them all; a peer must be given the new one.
        self.session = self.session_text();
        Ok(region)
    }

    fn deregister(&mut self, region: Region) -> Result<(), FabricError> {
        let i = self
            .regions
            .iter()
            .position(|(r, _)| r.id == region.id)
            .ok_or(FabricError::UnknownRegion(region.id))?;
        self.shared
            .fail_backlog(region.id, "the source region was deregistered");
        self.regions.remove(i);
        self.session = self.session_text();
        Ok(())
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), FabricError> {
        let WriteOp {
            region,
            local_offset,
            len,
            dest_session,
            dest_addr,
            tag,
            cookie,
        } = *write;
        let (r, desc) = match self.regions.iter().find(|(r, _)| r.id == region.id) {
            Some((r, mr)) => (*r, mr.desc()),
            None => return Err(FabricError::UnknownRegion(region.id)),
        };
        if local_offset.checked_add(len).is_none_or(|end| end > r.len) {
            return Err(FabricError::SourceOutOfBounds {
                region: r.id,
                offset: local_offset,
                len,
                region_len: r.len,
            });
        }
        let chunk = self.opened.chunk;
        let delivery = self.opened.delivery;
        let format_max = self.notice_format.max_chunks();
        let peer = self.peer(dest_session)?;
        let s = &peer.session;
        let Some(dest) = s.region_for(dest_addr, len) else {
            return Err(FabricError::DestOutOfBounds {
                peer: dest_session.to_owned(),
                addr: dest_addr,
                len,
                regions: s.regions.len(),
            });
        };
        let chunks = len.div_ceil(chunk).max(1);
        let peer_format = NoticeFormat::new(s.wide_data);
        if s.notify && chunks > peer_format.max_chunks().min(format_max) {
            return Err(FabricError::TooManyChunks {
                peer: dest_session.to_owned(),
                len,
                chunk,
                chunks,
                max: peer_format.max_chunks(),
            });
        }
        let (fi_addr, key, virt, base, notify) =
            (peer.fi_addr, dest.key, s.virt_addr, dest.base, s.notify);
        let name = Arc::clone(&peer.name);
        let mut flags = u64::from(sys::FI_COMPLETION);
        if delivery == Delivery::Complete {
            flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        let data = if notify {
            flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
            peer_format.encode(tag, chunks)
        } else {
            0
        };
        let deadline = Instant::now() + self.write_timeout;
        let mut book = self.shared.lock();
        let ws = WriteState {
            cookie,
            in_flight: 0,
            queued: chunks as u32,
            error: None,
            peer: name,
            posted: Instant::now(),
            deadline,
            reported: false,
        };
        let w = match book.free_writes.pop() {
            Some(w) => {
                book.writes[w as usize] = Some(ws);
                w
            }
            None => {
                book.writes.push(Some(ws));
                (book.writes.len() - 1) as u32
            }
        };
        for i in 0..chunks {
            let off = i * chunk;
            book.backlog.push_back(Chunk {
                write: w,
                region: r.id,
                local: (r.addr + local_offset + off) as usize,
                len: chunk.min(len - off) as usize,
                desc: desc as usize,
                dest: fi_addr,
                remote: MrPolicy::remote_addr(virt, base, dest_addr + off),
                key,
                data,
                flags,
            });
        }
        drop(book);
        if self.shared.drain(&self.endpoint) {
            // The rest goes out from the progress thread as the queue
            // drains; wake it in case it sleeps.
            self.shared.cq.signal();
        }
        Ok(())
    }

    fn poll_completion(&mut self) -> Option<Completion<FabricError>> {
        {
            let mut book = self.shared.lock();
            // Deadlines are kept here, on the caller's thread, not by the
            // progress thread: a provider call there can hang (libfabric
            // 1.17's shm spins forever on the lock of a peer that died
            // holding it), and the writes must still fail in time.
            let now = Instant::now();
            if now >= self.next_sweep {
                self.next_sweep = now + SWEEP;
                let expired = book.expire(now, self.write_timeout);
                let beat = Duration::from_millis(self.shared.beat.load(Ordering::Relaxed));
                let silent = self.shared.born.elapsed().saturating_sub(beat);
                let provider = &self.opened.provider;
                let silent_ms = silent.as_millis() as u64;
                match stall(
                    silent,
                    self.write_timeout,
                    book.held,
                    expired,
                    self.stuck_reported,
                ) {
                    Stall::Failing => {
                        self.stuck_reported = true;
                        tracing::error!(
                            %provider,
                            expired,
                            silent_ms,
                            "writes timed out while the progress thread was inside one provider call; later writes fail at their timeout until it returns"
                        );
                    }
                    Stall::Long => {
                        tracing::debug!(%provider, silent_ms, "the progress thread is inside a long provider call");
                    }
                    Stall::Back => {
                        self.stuck_reported = false;
                        tracing::info!(%provider, "the progress thread is back from the provider");
                    }
                    Stall::None => {}
                }
            }
            if let Some(c) = book.done.pop_front() {
                drop(book);
                self.evict_dead();
                return Some(c);
            }
        }
        self.evict_dead();
        // Clear first, then look again: news that comes after the look
        // signals the descriptor anew.
        self.shared.wake.clear();
        self.shared.lock().done.pop_front()
    }

    fn poll_landed(&mut self) -> Option<Landed> {
        if self.opened.delivery != Delivery::Notify {
            return None;
        }
        self.shared.lock().notices.pop_landed()
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.shared.wake.fd())
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.cq.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Fields drop in order: region, ..., pool last.
    }
}

/// An eventfd the progress thread signals when completions or notices
/// arrive, so that the runtime can sleep on it with its control channel.
struct WakeFd(std::os::fd::OwnedFd);

impl WakeFd {
    fn new() -> Result<Self, FabricError> {
        use std::os::fd::FromRawFd;
        // SAFETY: eventfd takes no pointers; a negative result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(FabricError::Os {
                what: "create the wake eventfd",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our own eventfd; a
        // full counter (EAGAIN) already signals.
        let _ = unsafe { libc::write(self.fd(), one.as_ptr().cast(), one.len()) };
    }

    fn clear(&self) {
        let mut v = [0u8; 8];
        // SAFETY: reads 8 bytes into a live buffer from our own
        // non-blocking eventfd; EAGAIN means it was clear.
        let _ = unsafe { libc::read(self.fd(), v.as_mut_ptr().cast(), v.len()) };
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn a_long_provider_call_is_an_error_only_once_writes_fail_for_it() {
        let t = Duration::from_secs(5);
        let long = Duration::from_secs(6);
        // A healthy run whose provider copies a large window in one call.
        assert_eq!(stall(long, t, false, 0, false), Stall::Long);
        assert_eq!(
            stall(Duration::from_millis(3), t, false, 0, false),
            Stall::None
        );
        // Held on purpose (a test pausing the thread) is not silence.
        assert_eq!(stall(long, t, true, 3, false), Stall::None);
        assert_eq!(stall(long, t, false, 2, false), Stall::Failing);
        // Said once; then it comes back.
        assert_eq!(stall(long, t, false, 2, true), Stall::Long);
        assert_eq!(stall(Duration::ZERO, t, false, 0, true), Stall::Back);
    }
}
