//! The two seams between the state machines and the outside world: the data
//! plane ([`Transport`]: register memory, post one-sided writes and reads,
//! poll their completions) and the control channel ([`ControlSend`] and
//! [`ControlRecv`]: send and receive the protocol's two-frame messages).
//! They are separate so that any control plane pairs with any data plane.
//! These three traits, and [`Fault`] for their errors, are all an embedder
//! implements; how a caller waits on them (file descriptors) is a set of
//! default methods that exist only with the `std` feature, so that the
//! no_std core holds no blocking contract.
//!
//! Both contracts are allocation-free: writes are named by a caller cookie,
//! messages are received into a caller buffer, and errors are typed values
//! that say what kind of failure they are ([`Fault`]), so that the runtime
//! can act on them (fail one request, drop one peer) without knowing the
//! backend.
//!
//! Modules: the failures' kinds (`fault`) and the errno values they are
//! read from ([`errno`]), the data plane (`data_plane`) and the control
//! channel (`control_channel`).

mod control_channel;
mod data_plane;
pub mod errno;
mod fault;

pub use control_channel::{ChannelEvent, ControlChannel, ControlRecv, ControlSend, Incoming};
pub use data_plane::{
    Capabilities, Completion, Landed, ReadOp, Region, RegionError, Transport, WriteOp, WriteTag,
};
pub use fault::{Fault, FaultKind};
