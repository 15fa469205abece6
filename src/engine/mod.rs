//! A transfer engine: one-sided writes and reads between processes'
//! registered memory, synchronous or through handles, with notifications.
//!
//! Register any memory of this process, then move bytes between it and a
//! peer's registered memory by the peer's session id and absolute
//! addresses. This is the level below ferry's nodes (no control plane, no
//! slots): what a serving runtime that keeps its own pools and protocol
//! asks of a data plane. It has sglang's `BaseTransferEngine` contract
//! ([`write`](TransferEngine::write), the Python module's
//! `tensorferry.TransferEngine`), and what NIXL-style connectors are built on:
//! * **transfers with handles**: [`post_write`](TransferEngine::post_write)
//!   and [`post_read`](TransferEngine::post_read) return a [`Transfer`] to
//!   poll ([`Transfer::state`]), wait on ([`Transfer::wait`]) or release;
//!   many may be in flight at once, from many threads;
//! * **one-sided reads** from a peer's registered memory, checked as
//!   writes are;
//! * **notifications**: short messages ([`MAX_NOTIFICATION`] bytes at
//!   most) sent alone ([`notify`](TransferEngine::notify)) or attached to a
//!   transfer (sent once its bytes are all in the peer's memory), read by
//!   the peer without waiting ([`notifications`](TransferEngine::notifications)),
//!   in order per sender.
//!
//! **What a transfer guarantees.** Once a transfer is final (done, failed,
//! or ended because its deadline passed), and once
//! [`Transfer::release`] returns, no byte of it moves in this process's
//! memory any more: its sources may be reused and a read's destinations
//! trusted. (A failed write's bytes that had already reached the peer's
//! host, in its kernel's socket buffer over libfabric `tcp`, may still be
//! placed when a stalled peer resumes: a failed write's destination holds
//! nothing to trust, and a peer that deregisters it gets no byte after
//! its `deregister` returns.) Past its deadline
//! the data plane ends the operations still running (a verbs queue pair
//! flushed, a local write not yet made dropped, a libfabric peer's
//! connection torn down) and the transfer becomes final once they have
//! ended. The data plane ends everything in flight with that peer, so
//! other transfers with the same peer fail too (libfabric resets its
//! endpoint to do so, and posts this side's operations with other peers
//! again; other peers' operations into this process under way then fail
//! at those peers, as over a broken connection). A data
//! plane that cannot end them has until [`END_GRACE`] past the deadline:
//! then the call returns [`EngineError::NotEnded`], the memory kept in
//! use. The engine refuses a data plane that cannot end a peer's
//! operations at all (libfabric 1.17's `shm`).
//!
//! **Who may reach it** is [`EngineConfig::guard`]: an allow-list and
//! CURVE keys on its notification inbox and its verbs side channel, by
//! default the guard the environment names (`FERRY_ALLOW_FROM`,
//! `FERRY_CURVE_KEY`, `FERRY_CURVE_PEERS`).
//!
//! It opens on a [`DataPlane`], the type that names every data plane for
//! engines and nodes alike (see [`crate::plane`]), each behind
//! tensorferry-core's `Transport` seam and driven the same way (`driven`):
//! * `local`: processes on one host, any memory, by cross-memory attach
//!   ([`tensorferry_local::LocalTransport`]).
//! * `fabric` (feature `fabric`): ferry's libfabric data plane,
//!   delivery-complete writes.
//! * `verbs` (feature `verbs`): RC queue pairs on an RDMA NIC.
//!
//! An embedder's own data plane runs the same way: [`TransferEngine::over`].
//! All of it is safe to call from many threads at once; a process that
//! only receives needs no calls at all (a thread of the engine answers
//! peers where the data plane needs one).

// Registration hands memory's lifetime to the caller, which only an unsafe
// signature can say.
#![allow(unsafe_code)]

mod driven;
mod error;
mod notify;
mod table;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorferry_core::transport::Transport;
pub use tensorferry_local::{Direction, LocalConfig, LocalError, Op};

pub use error::EngineError;
pub use notify::{Notification, MAX_NOTIFICATION, NOTIFY_BACKLOG, NOTIFY_WAIT};
pub use table::TransferState;

use driven::{Driven, Driver};
pub(crate) use notify::this_host;
use table::{Id, Peer};

pub use crate::plane::DataPlane;

/// The engine's data plane under its former name: every plane is a
/// [`DataPlane`] now, for engines and nodes alike.
#[deprecated(note = "renamed `tensorferry::plane::DataPlane`, which nodes take too")]
pub type Backend = DataPlane;

/// The engine's configuration under its former name.
#[deprecated(note = "renamed `EngineConfig`")]
pub type EngineOptions = EngineConfig;

/// How an engine is set up, beside its data plane.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The address of this host that peers send notifications to (the
    /// engine's inbox binds there, on a port the system picks). Default:
    /// loopback for a data plane that reaches this host only (`local`); for
    /// the others, the first IPv4 address of an interface that is up and
    /// not loopback (loopback if there is none).
    pub notify_host: Option<String>,
    /// Who may reach the engine's endpoints (its notification inbox, and
    /// the verbs data plane's side channel): an allow-list of addresses
    /// and, with CURVE, the keys admitted, which are also the only
    /// senders of notifications it believes (see
    /// [`notifications`](TransferEngine::notifications)). `None`: the
    /// guard the environment names (`FERRY_ALLOW_FROM`,
    /// `FERRY_CURVE_KEY`, `FERRY_CURVE_PEERS`, as a deployment sets them
    /// once for every ferry object of a process; none set: no guard).
    /// `Some(Guard::default())` guards nothing, whatever the environment
    /// says.
    pub guard: Option<tensorferry_zmq::Guard>,
}

/// What a transfer of this way calls posting its operations, for errors.
fn post_verb(direction: Direction) -> &'static str {
    match direction {
        Direction::Write => "post a write",
        Direction::Read => "post a read",
    }
}

/// An engine's session id: its data plane's, then `|` and the endpoint of
/// its notification inbox.
fn join_session(plane: &str, notify: &str) -> String {
    format!("{plane}|{notify}")
}

/// The peer a session id names: the data plane's part, and the
/// notification endpoint if it has one (a bare data-plane session id, as
/// a ferry node's, has none: transfers reach it, notifications do not).
fn peer_of(session: &str) -> Peer {
    let (plane, notify) = match session.rsplit_once('|') {
        Some((plane, notify)) => (plane, Some(notify.to_owned())),
        None => (session, None),
    };
    Peer {
        session: session.to_owned(),
        plane: plane.to_owned(),
        notify,
    }
}

/// How long past a transfer's deadline (or its release, if earlier) the
/// data plane is given to end its operations: `Transfer::finish`,
/// `write` and `read` return by then at the latest, with
/// [`EngineError::NotEnded`] if the data plane could not end them (its
/// memory then stays in use). The planes end theirs well within it: the
/// local plane at once, verbs within a second (its queue pair flushed or
/// destroyed), libfabric within a second (its endpoint reset).
pub const END_GRACE: Duration = Duration::from_secs(5);

/// A deadline `timeout` from now (far off when it overflows).
fn deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + FAR)
}

/// What "never" is in a deadline that would overflow.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// When a transfer due by `deadline` must be final by: the deadline plus
/// [`END_GRACE`] (the deadline itself, when that would overflow: it is
/// far off then).
fn limit_of(deadline: Instant) -> Instant {
    deadline.checked_add(END_GRACE).unwrap_or(deadline)
}

/// A transfer engine (see the module's documentation).
pub struct TransferEngine {
    inner: Arc<dyn Driver>,
    backend: &'static str,
    /// The peer transferred with last: a connector moves many transfers
    /// to one peer in a row, and parsing its session id anew costs more
    /// than a small write's copy.
    last_peer: std::sync::Mutex<Option<Arc<Peer>>>,
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
    /// Opens an engine on `plane`, with no memory registered.
    pub fn open(plane: DataPlane) -> Result<Self, EngineError> {
        Self::open_with(plane, EngineConfig::default())
    }

    /// Opens an engine on `plane`, set up as `config` says. Every plane
    /// but `shm` (whose pools are a node's own) serves an engine; the
    /// libfabric plane only on a provider that can end a peer's
    /// operations (not libfabric 1.17's `shm`).
    pub fn open_with(plane: DataPlane, config: EngineConfig) -> Result<Self, EngineError> {
        plane.open_engine(config)
    }

    /// An engine over an embedder's own data plane (or one of ferry's set
    /// up by hand), named `name`. The transport's completions must mean
    /// delivery ([`tensorferry_core::transport::Capabilities::delivery_complete`]):
    /// the engine counts no arrivals. Notifications bind on
    /// `options.notify_host` (default: loopback).
    pub fn over<T>(
        transport: T,
        name: &'static str,
        options: EngineConfig,
    ) -> Result<Self, EngineError>
    where
        T: Transport + Send + 'static,
    {
        if !transport.capabilities().delivery_complete {
            return Err(EngineError::Transport {
                verb: "open an engine",
                message: format!(
                    "the {name} data plane's completions do not mean delivery; the engine needs them to"
                ),
                kind: tensorferry_core::transport::FaultKind::Io,
            });
        }
        let guard = match options.guard {
            Some(g) => g,
            None => tensorferry_zmq::Guard::from_env()?,
        };
        let host = options.notify_host.unwrap_or_else(|| "127.0.0.1".into());
        Self::start(transport, name, &host, &guard)
    }

    pub(crate) fn start<T>(
        transport: T,
        name: &'static str,
        host: &str,
        guard: &tensorferry_zmq::Guard,
    ) -> Result<Self, EngineError>
    where
        T: Transport + Send + 'static,
    {
        Ok(Self {
            inner: Arc::new(Driven::start(transport, host, guard)?),
            backend: name,
            last_peer: std::sync::Mutex::new(None),
        })
    }

    /// The peer `session` names (the last one again, if it is).
    fn peer(&self, session: &str) -> Arc<Peer> {
        let mut last = self
            .last_peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some(p) if p.session == session => Arc::clone(p),
            _ => {
                let p = Arc::new(peer_of(session));
                *last = Some(Arc::clone(&p));
                p
            }
        }
    }

    /// The backend's name: `local`, `fabric`, `verbs`, or what
    /// [`over`](Self::over) was given.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The session id peers reach this engine by: its data plane's, and
    /// where its notifications go. Some data planes name the registered
    /// regions in it (libfabric's keys), so read it after registering.
    pub fn session_id(&self) -> String {
        self.inner.session_id()
    }

    /// Registers `len` bytes at `addr`, for peers to write into and read
    /// from, and this engine to write from and read into.
    ///
    /// # Safety
    /// The memory must stay mapped until [`deregister`](Self::deregister)
    /// returns, or until the engine and every [`Transfer`] posted on it
    /// are dropped (a transfer keeps the data plane, and so its
    /// registrations, alive), and the caller must expect peers to write
    /// into it at any time while registered.
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<(), EngineError> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.register(addr, len) }
    }

    /// Ends the registration of the region that starts at `addr`.
    pub fn deregister(&self, addr: u64) -> Result<(), EngineError> {
        self.inner.deregister(addr)
    }

    /// Posts a transfer of every op in `direction` with the peer
    /// `session`, ended if it is still running after `timeout`. With
    /// `notify`, the peer is sent that notification once every byte is
    /// there (a transfer that fails sends none). Refused whole (nothing
    /// posted) if any op's local range lies outside this engine's
    /// registered memory.
    pub fn post(
        &self,
        direction: Direction,
        session: &str,
        ops: &[Op],
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<Transfer, EngineError> {
        let id = self.inner.post(
            direction,
            self.peer(session),
            ops,
            deadline(timeout),
            notify.map(<[u8]>::to_vec),
        )?;
        Ok(Transfer {
            inner: Arc::clone(&self.inner),
            id,
            released: false,
        })
    }

    /// [`post`](Self::post) of writes: each op's `src` here, `dst` in the
    /// peer.
    pub fn post_write(
        &self,
        session: &str,
        ops: &[Op],
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<Transfer, EngineError> {
        self.post(Direction::Write, session, ops, timeout, notify)
    }

    /// [`post`](Self::post) of reads: each op's `src` in the peer's
    /// registered memory, `dst` here.
    pub fn post_read(
        &self,
        session: &str,
        ops: &[Op],
        timeout: Duration,
        notify: Option<&[u8]>,
    ) -> Result<Transfer, EngineError> {
        self.post(Direction::Read, session, ops, timeout, notify)
    }

    /// Writes every op into the peer `session` and returns once every byte
    /// is at the peer, or fails; whatever it returns, no byte of it moves
    /// afterwards (see the module's documentation). The data plane's own
    /// write timeout, where it has one, fails a write earlier if it is
    /// shorter than `timeout`.
    pub fn write(&self, session: &str, ops: &[Op], timeout: Duration) -> Result<(), EngineError> {
        self.post_write(session, ops, timeout, None)?.finish()
    }

    /// Reads every op from the peer `session`'s registered memory and
    /// returns once every byte is here, or fails, as [`write`](Self::write)
    /// does.
    pub fn read(&self, session: &str, ops: &[Op], timeout: Duration) -> Result<(), EngineError> {
        self.post_read(session, ops, timeout, None)?.finish()
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
        let ops = ops_of_lists(sources, dests, lengths)?;
        self.write(session, &ops, timeout)
    }

    /// Sends `message` to the peer engine `session` now, from this thread,
    /// after the notifications this engine sent it before. A peer that
    /// reads none fails only the sends to it: once its outbox is full
    /// ([`NOTIFY_BACKLOG`] bytes beyond the sockets' buffers), this waits
    /// for room at most [`NOTIFY_WAIT`], then fails with kind `Timeout`.
    pub fn notify(&self, session: &str, message: &[u8]) -> Result<(), EngineError> {
        notify::check_len(message.len())?;
        self.inner.notify(&peer_of(session), message)
    }

    /// Every notification that has arrived since the last call, in order
    /// per sender; does not wait. Under CURVE (see [`EngineConfig::guard`])
    /// a notification's `from` is a session id whose inbox key is the key
    /// its connection was admitted with: one naming another is dropped
    /// ([`forged_notifications`](Self::forged_notifications)). Without
    /// CURVE, `from` is what the sender wrote.
    pub fn notifications(&self) -> Result<Vec<Notification>, EngineError> {
        let mut got = Vec::new();
        self.inner.notifications(&mut got)?;
        Ok(got)
    }

    /// A descriptor to wait on for notifications: it polls readable
    /// (`poll`, `epoll`, an event loop's reader) when notifications may
    /// have arrived that [`notifications`](Self::notifications) has not
    /// taken, so that a thread that reads them need not poll in a loop.
    /// Readable is a hint: the call may then find none (a connection
    /// closed, or part of a notification came). Valid while the engine
    /// lives; never close it.
    pub fn notification_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.notification_fd()
    }

    /// Notifications dropped so far because, under CURVE, they named a
    /// sender other than the key they came with.
    pub fn forged_notifications(&self) -> u64 {
        self.inner.forged_notifications()
    }
}

/// Three lists (sglang's batch) as ops, refused if their lengths differ.
pub fn ops_of_lists(
    sources: &[u64],
    dests: &[u64],
    lengths: &[u64],
) -> Result<Vec<Op>, EngineError> {
    if sources.len() != dests.len() || dests.len() != lengths.len() {
        return Err(EngineError::BatchShape {
            sources: sources.len(),
            dests: dests.len(),
            lengths: lengths.len(),
        });
    }
    Ok(sources
        .iter()
        .zip(dests)
        .zip(lengths)
        .map(|((&src, &dst), &len)| Op { src, dst, len })
        .collect())
}

/// A posted transfer: poll it, wait on it, release it. Dropping it
/// releases it (see [`release`](Self::release)). It keeps its engine's
/// data plane alive.
pub struct Transfer {
    inner: Arc<dyn Driver>,
    id: Id,
    released: bool,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not its state: asking polls the data plane.
        f.debug_struct("Transfer")
            .field("slot", &self.id.slot)
            .field("generation", &self.id.gen)
            .finish()
    }
}

impl Transfer {
    /// Where it stands, without waiting (it polls the data plane once,
    /// and ends the transfer if its deadline has passed).
    pub fn state(&self) -> TransferState {
        self.inner.state(self.id).unwrap_or(TransferState::Failed)
    }

    /// Waits at most `within` for it to become final; returns
    /// `Ok(Done)`, `Ok(Pending)` (still running: its deadline has not come,
    /// or its operations, ended at the deadline, have not ended yet: at
    /// most [`END_GRACE`] later), or its failure.
    pub fn wait(&self, within: Duration) -> Result<TransferState, EngineError> {
        let until = deadline(within);
        match self.inner.wait(self.id, Some(until)) {
            Some(TransferState::Failed) | None => Err(self.error()),
            Some(state) => Ok(state),
        }
    }

    /// Why it failed (an error saying it did not fail, if it did not).
    fn error(&self) -> EngineError {
        self.inner
            .failure(self.id)
            .unwrap_or(EngineError::Transport {
                verb: "transfer",
                message: "the transfer is gone".into(),
                kind: tensorferry_core::transport::FaultKind::Io,
            })
    }

    /// Waits until it is final (its deadline bounds that), releases it,
    /// and returns how it went.
    pub fn finish(self) -> Result<(), EngineError> {
        // Final by its deadline: releasing it then ends nothing.
        let _ = self.inner.wait(self.id, None);
        self.release()
    }

    /// Ends it if it is still running, and returns once no byte of it
    /// moves any more (its data plane ends every operation in flight with
    /// the same peer, as a deadline does). Returns how it went: `Ok` if it
    /// had finished, else its failure.
    pub fn release(mut self) -> Result<(), EngineError> {
        self.released = true;
        match self.inner.release(self.id) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.inner.release(self.id);
        }
    }
}
