//! The two seams between the state machines and the outside world: the data
//! plane ([`Transport`]: register memory, post one-sided writes and reads,
//! poll their completions) and the control channel ([`ControlSend`] and
//! [`ControlRecv`]: send and receive the protocol's two-frame messages).
//! They are separate so that any control plane pairs with any data plane.
//! These three traits are all an embedder implements: each says which
//! [`FaultKind`] its errors are (`fault_kind`). A data plane that owns the
//! pool a node receives into (ferry's own: shared-memory segments, the
//! RDMA planes' registered pools) says so with the unsafe [`PoolOwner`],
//! declared here beside `Transport` and implemented next to each pool; an
//! embedder's transport need not, since a node can map its own pool and
//! register it (the runtime's `InstanceNode::start_with_pool`). How a
//! caller waits on both at once is a descriptor: the data plane's
//! (`Transport::wake_fd`, with the `std` feature) handed to
//! [`ControlRecv::recv`], so that the no_std core holds no blocking
//! contract.
//!
//! Both contracts are allocation-free: writes are named by a caller cookie,
//! messages are received into a caller buffer, and errors are typed values
//! whose kind of failure ([`FaultKind`]) their trait names, so that the
//! runtime can act on them (fail one request, drop one peer) without
//! knowing the backend.
//!
//! Modules: the failures' kinds (`fault`) and the errno values they are
//! read from ([`errno`]), the data plane (`data_plane`), the pool's
//! owner (`pool_owner`), the registered regions' table every data plane
//! keeps (`regions`, with the `alloc` feature) and the control channel
//! (`control_channel`).

mod control_channel;
mod data_plane;
pub mod errno;
mod fault;
mod pool_owner;
#[cfg(feature = "alloc")]
mod regions;

pub use control_channel::{
    ChannelEvent, ControlChannel, ControlRecv, ControlSend, Incoming, WAKE_POLL,
};
pub use data_plane::{
    Capabilities, Completion, Landed, OpSpan, ReadOp, Region, RegionError, Transport, WriteOp,
    WriteTag,
};
pub use fault::FaultKind;
pub use pool_owner::PoolOwner;
#[cfg(feature = "alloc")]
pub use regions::{OutsideOwnRegions, OutsidePeerRegions, Regions};
