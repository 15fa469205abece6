//! ferry's ibverbs data plane: one RC queue pair per peer session,
//! one-sided RDMA WRITE into the peer's registered regions and RDMA READ
//! from them, on InfiniBand and RoCE NICs.
//!
//! - [`VerbsTransport`] implements tensorferry-core's `Transport`. Its session id
//!   ([`Session`]) names the endpoint of its side channel, a ZeroMQ socket
//!   where it answers connection exchanges ([`exchange`]).
//! - The first write to (or read from) a peer exchanges QP number, LID,
//!   GID, PSN, MTU, how many RDMA READs each queue pair answers at once,
//!   and every registered region's address, length and rkey, then walks
//!   both queue pairs
//!   RESET → INIT → RTR → RTS ([`attrs`]). The GID index is chosen from the
//!   port's table ([`gid`]) or configured.
//! - Writes and reads are split at the port's maximum message; only the
//!   last chunk (and one per half window) is signaled; a bounded window
//!   caps what is outstanding ([`chunk`]). Both share the connection's
//!   queue pair, in the order posted (a write after a read is fenced).
//!   A read's source is checked against the regions the peer listed, as
//!   a write's destination is.
//! - A completion error fails the transfers of that connection with the
//!   peer and the status ([`WcStatus`]); the connection is dropped and the
//!   next transfer with that peer reconnects. Transfers and connection
//!   exchanges have deadlines.
//! - A completion is final. A connection that fails (an error completion,
//!   its write timeout) or whose transfers are cancelled
//!   (`cancel_transfers`) first moves its queue pair to the error state
//!   and posts a marker; its writes and reads complete once the marker
//!   has, when every work request before it has completed, flushed or
//!   done, and none reads or writes memory any more.
//! - The side channel is guarded as the control channel is
//!   ([`tensorferry_zmq::Guard`]): `allow_from` and, with the node's CURVE key,
//!   a CURVE server admitting only `writers`, whose public key travels in
//!   the session id ([`VerbsConfig`]). A peer admitted there may write
//!   into the registered regions and read them.
//! - The side channel bounds what a peer can make it hold or do: frames
//!   larger than an exchange message drop their connection (libzmq's
//!   MAXMSGSIZE) and few requests queue per connection. Each request is
//!   bound to the requester its connection proves (under CURVE its key,
//!   and the writer session it names must carry that key; without CURVE
//!   its IP address, over `ipc://` the connection): a target keeps the
//!   queue pairs it accepted by requester and writer session, so a request
//!   never replaces another requester's, and drops for room only the
//!   oldest of the same requester (`max_per_writer`) or, at
//!   `max_writers` in all, of the requester holding the most.
//! - Verbs are reached through the [`Device`] trait: [`IbvDevice`] over
//!   `sideway` (which loads libibverbs at run time), and in tests a
//!   software stand-in that runs the same connection logic without a NIC.

// Unsafe code only at the FFI and registration seams: `ibv` (verbs),
// `transport` (registration) and `conn` (posting registered memory), and
// the test stand-in's copy; each block with its SAFETY argument.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod attrs;
pub mod chunk;
mod conn;
pub mod device;
mod error;
pub mod exchange;
pub mod gid;
mod ibv;
pub mod report;
pub mod session;
mod side;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod status;
mod transport;
mod wake;

pub use conn::ConnState;
pub use device::{Device, Verb};
pub use error::VerbsError;
pub use gid::GidChoice;
pub use ibv::{device_names, require_test_device, test_device, IbvDevice, TEST_DEVICE_VAR};
pub use session::Session;
pub use status::WcStatus;
pub use transport::{VerbsConfig, VerbsTransport};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_guard;
