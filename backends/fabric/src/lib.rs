//! ferry's libfabric data plane: one RDM endpoint per process, one
//! registered pool, and one-sided writes into peers' pools (and reads from
//! them) over any provider that offers RMA on reliable datagram endpoints:
//! `efa` on AWS, `verbs;ofi_rxm` on InfiniBand and RoCE NICs, and
//! `tcp;ofi_rxm` and `shm`, which run on any Linux host.
//!
//! - [`FabricTransport`] implements tensorferry-core's `Transport`; its session
//!   id ([`Session`]) carries the endpoint address and the pool's key,
//!   base and length.
//! - Delivery is made sure of before a receiver reads: with
//!   `FI_DELIVERY_COMPLETE` where the provider offers it, otherwise with
//!   remote CQ data the receiver counts ([`notice`]).
//! - Large writes are split at the provider's `max_msg_size` (or a smaller
//!   configured chunk); a full queue (`-FI_EAGAIN`) is waited out while the
//!   progress thread drains it; completion errors fail the one write.
//! - Reads (`fi_readmsg`) are checked, split, timed out and cancelled as
//!   writes are; a read's completion means its bytes are here, and it
//!   gives the peer no notice. A provider without `FI_READ` and
//!   `FI_REMOTE_READ` is opened for writes alone, and its reads are
//!   refused naming it.

// Unsafe code only at the FFI seams: `ofi` (libfabric calls),
// `transport` (posting from registered memory) and
// `baseline`; each block with its SAFETY argument.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod baseline;
mod error;
pub mod listing;
pub mod mr;
pub mod notice;
pub mod ofi;
pub mod provider;
pub mod session;
mod transport;

pub use error::{Call, FabricError, OpKind};
pub use mr::MrPolicy;
pub use provider::{DeliveryMode, Hints, Provider};
pub use session::{RemoteRegion, Session, MAX_REGIONS};
pub use tensorferry_hostmem::HostPool;
pub use transport::{FabricConfig, FabricTransport, Opened};
