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
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

pub use copy::{Direction, Op};
pub use error::LocalError;
pub use table::MAX_REGIONS;
use tensorferry_hostmem::Copier;
pub use transport::LocalTransport;

use peer::Peer;
use session::Session;
use table::{Lookup, Table};

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
    pub parallel_min: u64,
    /// How long `deregister` and drop wait for peers' writes and reads
    /// still inside this engine's table (a peer killed mid-copy never
    /// leaves).
    pub drain_wait: Duration,
}

impl Default for LocalConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            threads: cores.clamp(1, 4),
            parallel_min: 8 << 20,
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
        let split_at = usize::try_from(config.parallel_min).unwrap_or(usize::MAX);
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
    /// The memory is the caller's: it must stay mapped until
    /// [`deregister`](Self::deregister) returns, and it may change under
    /// any reference the caller holds while registered. Writes into memory
    /// that is not mapped fail with an error at the writer (the kernel
    /// checks every address), so a wrong range cannot corrupt this
    /// process beyond the range itself.
    pub fn register(&self, addr: u64, len: u64) -> Result<(), LocalError> {
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
        let at = regions.partition_point(|&(b, _)| b < addr);
        regions.insert(at, (addr, len));
        self.table.publish(&regions);
        Ok(())
    }

    /// Ends the registration of the region that starts at `addr`. When it
    /// returns, no peer's write into the region or read from it is still
    /// running (unless a peer stayed inside the table longer than
    /// [`LocalConfig::drain_wait`], which is logged).
    pub fn deregister(&self, addr: u64) -> Result<(), LocalError> {
        let mut regions = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        let at = regions
            .iter()
            .position(|&(b, _)| b == addr)
            .ok_or(LocalError::NotRegistered { addr })?;
        regions.remove(at);
        self.table.publish(&regions);
        drop(regions);
        self.drain();
        Ok(())
    }

    /// Waits until no peer's write or read is inside this engine's table.
    fn drain(&self) {
        let deadline = Instant::now() + self.config.drain_wait;
        let mut pause = Duration::from_micros(1);
        while !self.table.quiescent() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    session = %self.session,
                    waited = ?self.config.drain_wait,
                    "a peer's write into or read from this engine did not finish (its process may have died mid-copy); going on"
                );
                return;
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
        let inside = peer.table.enter();
        let ranges = ops
            .iter()
            .filter(|o| o.len > 0)
            .map(|o| (dir.remote(o), o.len));
        match inside.check(ranges) {
            Lookup::Inside => {}
            Lookup::Outside(addr, len) => {
                let session = session.to_owned();
                return Err(match dir {
                    Direction::Write => LocalError::DestOutOfBounds { session, addr, len },
                    Direction::Read => LocalError::ReadSourceOutOfBounds { session, addr, len },
                });
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
                return Err(match dir {
                    Direction::Write => LocalError::SourceOutOfBounds { addr, len },
                    Direction::Read => LocalError::ReadDestOutOfBounds { addr, len },
                });
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
    fn drop(&mut self) {
        self.table.close();
        self.drain();
    }
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
