//! tensorferry-shm: the shared-memory loopback backend, for processes on one
//! host and for tests.
//!
//! * [`ShmPool`]: a pool in a POSIX shared-memory object, mapped into its
//!   owner, unlinked when the owner drops it; [`clean_stale`] removes the
//!   objects of processes that died without dropping theirs.
//! * [`ShmTransport`]: tensorferry-core's `Transport`. A session id names the
//!   object and the owner's base address, so a peer maps the object once
//!   and turns the protocol's `dest_addr` into an offset; a write is a
//!   bounds-checked `memcpy` into that mapping, split across the threads
//!   of a `tensorferry_hostmem::Copier` when large.
//! * [`UdsChannel`]: tensorferry-core's `ControlChannel` over Unix
//!   `SOCK_SEQPACKET` sockets (message boundaries, the peer's endpoint, and
//!   a closed connection reported as the peer gone).
//! * [`MemChannel`]: an in-process control channel for tests.

mod error;
mod guard;
mod mem;
mod pool;
mod session;
mod stale;
mod transport;
mod uds;

pub use error::{MemError, ShmError, UdsError};
pub use mem::{MemChannel, MemHub};
pub use pool::{prefix, ShmPool};
pub use session::SessionId;
pub use stale::{clean_stale, clean_stale_with_prefix};
pub use transport::ShmTransport;
pub use uds::{UdsChannel, UdsReceiver, UdsSender};
