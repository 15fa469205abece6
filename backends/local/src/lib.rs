//! ferry's same-host data plane for memory the application allocated.
//!
//! A [`LocalEngine`] registers any ranges of this process's memory (a
//! numpy array, a torch tensor, sglang's pool) and publishes them in a
//! region table that peers on the host attach to by its session id. A
//! write checks its source against this engine's regions and its
//! destination against the peer's table, then copies with
//! `process_vm_writev`: when [`LocalEngine::write`] returns, the bytes are
//! in the peer's memory, and the peer took no part. A read is the mirror
//! ([`LocalEngine::read`], `process_vm_readv`): its source is checked
//! against the peer's table, its destination against this engine's
//! regions. See docs/src/data-planes.md ("Cross-memory attach") for the permissions this needs.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod copy;
mod error;
mod peer;
pub mod session;
mod table;
mod transport;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tensorferry_core::transport::OutsidePeerRegions;
use tensorferry_hostmem::Copier;

pub use copy::{Direction, Op};
pub use error::LocalError;
pub use table::MAX_REGIONS;
pub use transport::LocalTransport;

use peer::Peer;
use session::Session;
use table::{Lookup, Occupancy, Table};

/// Peers remembered before the cache is emptied (a process that writes to
/// ever new peers should not keep every dead one's descriptors).
const MAX_PEERS: usize = 1024;

/// How a local engine works.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    /// Threads that share a large write or read (1: the caller's thread
    /// only).
    pub threads: usize,
    /// Writes and reads (or batches) of at least this many bytes are
    /// spread over the threads.
    pub split_at: u64,
    /// How long `deregister` waits for peers' writes and reads still
    /// inside this engine's table before it fails, leaving the region
    /// registered (a peer that died mid-copy is not waited for; one that
    /// is stopped is).
    pub drain_wait: Duration,
}

impl Default for LocalConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            threads: cores.clamp(1, 4),
            split_at: 8 << 20,
            drain_wait: Duration::from_secs(5),
        }
    }
}

/// A same-host engine: registered regions, and writes into peers' and
/// reads from them.
pub struct LocalEngine {
    session: String,
    host: String,
    table: Table,
    /// Keeps the table's descriptor number, which the session id names,
    /// open in this process.
    table_fd: OwnedFd,
    /// This engine's regions, `(base, len)`, sorted by base.
    regions: RwLock<Vec<(u64, u64)>>,
    /// Regions taken out of the table whose deregistration has not ended:
    /// a peer's copy that may touch them was still running when it gave
    /// up waiting. Their memory stays the engine's until a `deregister`
    /// of them returns `Ok`.
    retiring: Mutex<Vec<(u64, u64)>>,
    peers: RwLock<HashMap<String, Arc<Peer>>>,
    copier: Copier,
    config: LocalConfig,
}

impl std::fmt::Debug for LocalEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEngine")
            .field("session", &self.session)
            .field("table_fd", &self.table_fd.as_raw_fd())
            .finish_non_exhaustive()
    }
}

impl LocalEngine {
    /// Opens an engine with no region registered.
    pub fn open(config: LocalConfig) -> Result<Self, LocalError> {
        let host = session::this_host()?;
        let nonce = nonce();
        let (table, table_fd) = Table::create(nonce)?;
        let session = Session {
            host: host.clone(),
            pid: std::process::id() as i32,
            fd: table_fd.as_raw_fd(),
            nonce,
        }
        .to_string();
        let split_at = usize::try_from(config.split_at).unwrap_or(usize::MAX);
        let copier = Copier::new(config.threads, split_at, "ferry-local").map_err(|source| {
            LocalError::Sys {
                call: "start the copy threads",
                source,
            }
        })?;
        Ok(Self {
            session,
            host,
            table,
            table_fd,
            regions: RwLock::new(Vec::new()),
            retiring: Mutex::new(Vec::new()),
            peers: RwLock::new(HashMap::new()),
            copier,
            config,
        })
    }

    /// The session id peers write to and read from this engine by.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// The regions registered, `(base, len)`, by base.
    pub fn regions(&self) -> Vec<(u64, u64)> {
        self.regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Registers `len` bytes at `addr`: peers may write into them and read
    /// from them from now on, and this engine may write from them and read
    /// into them.
    ///
    /// # Safety
    /// The memory is the caller's: it must stay mapped until
    /// [`deregister`](Self::deregister) returns `Ok` (or the engine is
    /// dropped), and the caller must expect it to change at any time
    /// while registered: no reference that assumes its bytes do not
    /// change may be held over it. Writes into memory that is not mapped
    /// fail with an error at the writer (the kernel checks every address).
    #[allow(unsafe_code)]
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<(), LocalError> {
        let bad = |why| LocalError::Register { addr, len, why };
        if len == 0 {
            return Err(bad("the region is empty"));
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| bad("its end overflows 64 bits"))?;
        let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        if regions.len() >= MAX_REGIONS {
            return Err(bad("this engine holds the most regions it can (256)"));
        }
        if regions.iter().any(|&(b, l)| addr < b + l && b < end) {
            return Err(bad("it overlaps a region registered already"));
        }
        if lock(&self.retiring)
            .iter()
            .any(|&(b, l)| addr < b + l && b < end)
        {
            return Err(bad(
                "it overlaps a region whose deregistration has not ended (a peer's copy may still touch it)",
            ));
        }
        let at = regions.partition_point(|&(b, _)| b < addr);
        regions.insert(at, (addr, len));
        self.table.publish(&regions);
        Ok(())
    }

    /// Ends the registration of the region that starts at `addr`. When it
    /// returns `Ok`, no peer's write into the region or read from it is
    /// still running, and none can start: the memory is the caller's
    /// again. A peer still copying after [`LocalConfig::drain_wait`] (one
    /// that is stopped; one that died, its process id perhaps given to
    /// another process since, is not waited for) fails it with
    /// [`LocalError::PeerInside`]: the region is out of the table (no new
    /// copy reaches it) but stays this engine's, its memory must stay
    /// mapped, and `deregister` may be called again.
    pub fn deregister(&self, addr: u64) -> Result<(), LocalError> {
        let region = {
            let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
            let mut retiring = lock(&self.retiring);
            match retiring.iter().find(|&&(b, _)| b == addr) {
                Some(&r) => r,
                None => {
                    let at = regions
                        .iter()
                        .position(|&(b, _)| b == addr)
                        .ok_or(LocalError::NotRegistered { addr })?;
                    let r = regions.remove(at);
                    self.table.publish(&regions);
                    retiring.push(r);
                    r
                }
            }
        };
        self.drain(self.config.drain_wait)
            .map_err(|(pids, unnamed)| LocalError::PeerInside {
                addr: region.0,
                len: region.1,
                waited: self.config.drain_wait,
                pids,
                unnamed,
            })?;
        lock(&self.retiring).retain(|&r| r != region);
        Ok(())
    }

    /// Waits at most `wait` until no peer's write or read is inside this
    /// engine's table; `Err`: the processes still inside, and the copies
    /// of unnamed ones.
    fn drain(&self, wait: Duration) -> Result<(), (Vec<u32>, u64)> {
        // No deadline: a wait too long to add is a wait without end (this
        // runs in `drop`, which must not panic).
        let deadline = Instant::now().checked_add(wait);
        let mut pause = Duration::from_micros(1);
        loop {
            match self.table.inside() {
                Occupancy::Quiet => return Ok(()),
                Occupancy::Writers { pids, unnamed }
                    if deadline.is_some_and(|d| Instant::now() >= d) =>
                {
                    return Err((pids, unnamed))
                }
                Occupancy::Writers { .. } => {}
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Writes every op of `ops` into the peer `session`: each source must
    /// lie in a region of this engine, each destination in one of the
    /// peer's. When it returns `Ok`, every byte is in the peer's memory;
    /// on an error, none, some or all of them may be.
    pub fn write(&self, session: &str, ops: &[Op]) -> Result<(), LocalError> {
        self.transfer(session, ops, Direction::Write)
    }

    /// Reads every op of `ops` from the peer `session`: each source must
    /// lie in a region the peer registered, each destination in one of
    /// this engine's. When it returns `Ok`, every byte is in this
    /// process's memory; on an error, none, some or all of them may be.
    pub fn read(&self, session: &str, ops: &[Op]) -> Result<(), LocalError> {
        self.transfer(session, ops, Direction::Read)
    }

    /// A write or a read: this engine's side of every op checked against
    /// its regions, the peer's side against its table while counted in it
    /// (so that the peer's `deregister` waits for the copy), then copied.
    pub(crate) fn transfer(
        &self,
        session: &str,
        ops: &[Op],
        dir: Direction,
    ) -> Result<(), LocalError> {
        self.check_local(ops, dir)?;
        let peer = self.peer(session)?;
        if !peer.alive() {
            self.forget(session);
            return Err(LocalError::PeerGone {
                session: session.to_owned(),
                why: format!("its process {} exited", peer.pid),
            });
        }
        let inside = peer.table.enter(peer.lease.as_ref());
        let ranges = ops
            .iter()
            .filter(|o| o.len > 0)
            .map(|o| (dir.remote(o), o.len));
        match peer.table.check(&inside, ranges) {
            Lookup::Inside => {}
            Lookup::Outside { addr, len, regions } => {
                return Err(OutsidePeerRegions {
                    read: dir == Direction::Read,
                    peer: session.to_owned(),
                    addr,
                    len,
                    regions,
                }
                .into());
            }
            Lookup::Closed => {
                drop(inside);
                self.forget(session);
                return Err(LocalError::PeerGone {
                    session: session.to_owned(),
                    why: "it closed its engine".into(),
                });
            }
            Lookup::Busy => {
                return Err(LocalError::TableBusy {
                    session: session.to_owned(),
                })
            }
        }
        let total: u64 = ops.iter().map(|o| o.len).sum();
        let piece = if self.copier.splits(total) {
            copy::PIECE
        } else {
            0
        };
        let groups = copy::plan(ops, piece);
        let result = match dir {
            Direction::Write => copy::write_all(peer.pid, &groups, &self.copier),
            Direction::Read => copy::read_all(peer.pid, &groups, &self.copier),
        };
        drop(inside);
        result.map_err(|short| self.short(&peer, short, dir))
    }

    fn short(&self, peer: &Peer, short: copy::Short, dir: Direction) -> LocalError {
        match short.error {
            Some(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                self.forget(&peer.text);
                LocalError::PeerGone {
                    session: peer.text.clone(),
                    why: format!("its process {} exited", peer.pid),
                }
            }
            Some(e) if e.raw_os_error() == Some(libc::EFAULT) => LocalError::Partial {
                session: peer.text.clone(),
                direction: dir,
                written: short.written,
                len: short.len,
                why: "the peer has no memory mapped at part of a region it registered (EFAULT)"
                    .into(),
            },
            Some(e) => LocalError::PeerSys {
                call: dir.call(),
                session: peer.text.clone(),
                pid: peer.pid,
                hint: error::hint(e.raw_os_error()),
                source: e,
            },
            None => LocalError::Partial {
                session: peer.text.clone(),
                direction: dir,
                written: short.written,
                len: short.len,
                why: "the kernel stopped at memory the peer has not mapped".into(),
            },
        }
    }

    /// Checks this engine's side of every op (a write's source, a read's
    /// destination) against its regions.
    fn check_local(&self, ops: &[Op], dir: Direction) -> Result<(), LocalError> {
        let regions = self.regions.read().unwrap_or_else(PoisonError::into_inner);
        for op in ops.iter().filter(|o| o.len > 0) {
            let addr = dir.local(op);
            let inside = addr.checked_add(op.len).is_some_and(|end| {
                let at = regions.partition_point(|&(b, _)| b <= addr);
                at > 0 && {
                    let (b, l) = regions[at - 1];
                    end <= b + l
                }
            });
            if !inside {
                let len = op.len;
                return Err(dir.outside_own(addr, len).into());
            }
        }
        Ok(())
    }

    fn peer(&self, text: &str) -> Result<Arc<Peer>, LocalError> {
        if let Some(p) = self
            .peers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(text)
        {
            return Ok(Arc::clone(p));
        }
        let session = Session::parse(text)?;
        if session.host != self.host {
            return Err(LocalError::OtherHost {
                session: text.to_owned(),
                theirs: session.host,
                ours: self.host.clone(),
            });
        }
        let peer = Arc::new(Peer::attach(text, &session)?);
        let mut peers = self.peers.write().unwrap_or_else(PoisonError::into_inner);
        if peers.len() >= MAX_PEERS {
            peers.clear();
        }
        Ok(Arc::clone(
            peers.entry(text.to_owned()).or_insert_with(|| peer),
        ))
    }

    fn forget(&self, text: &str) {
        self.peers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(text);
    }
}

impl Drop for LocalEngine {
    /// Closes the table, then waits until no peer copies into or out of a
    /// region still registered (or whose deregistration failed): the
    /// caller may free that memory once the engine is gone. A peer that
    /// stays inside (a stopped process) is waited for, said every
    /// `drain_wait`; one that died is not.
    fn drop(&mut self) {
        self.table.close();
        let held = !self
            .regions
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
            || !lock(&self.retiring).is_empty();
        if !held {
            return;
        }
        while let Err((pids, unnamed)) = self.drain(self.config.drain_wait) {
            tracing::warn!(
                session = %self.session,
                ?pids,
                unnamed,
                waited = ?self.config.drain_wait,
                "a peer's copy into or out of this engine's memory is still running; the engine waits for it before its memory is given back"
            );
        }
    }
}

fn lock<X>(m: &Mutex<X>) -> std::sync::MutexGuard<'_, X> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A nonce no other engine on the host is likely to have: the clock, the
/// process and a counter, mixed.
fn nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut h = t ^ (u64::from(std::process::id()) << 32) ^ COUNT.fetch_add(1, Ordering::Relaxed);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_read;
