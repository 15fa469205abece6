//! The std runtime: tensorferry-core's state machines driven over a control
//! channel and a data plane, each by a progress thread, with the API a
//! serving runtime embeds.
//!
//! * [`InstanceNode`]: stage a request's tensors and commit them; receive
//!   transfers as typed tensor views over the slot; release them.
//! * [`CoordinatorNode`]: the coordinator, relaying between instances.
//! * [`DataPlane`]: every data plane an instance runs on (shared memory,
//!   cross-memory attach; libfabric with cargo feature `fabric`; ibverbs
//!   with `verbs`), named, configured and started by one type, the
//!   engine's too (see [`crate::plane`]).
//!
//! Every hand-off is traced (`tracing`, target `ferry`), counted
//! ([`MetricsSnapshot`]) and timed ([`telemetry`], which also serves it
//! all to Prometheus).

mod channel;
mod clock;
mod coordinator;
mod error;
mod instance;
mod memory;
mod metrics;
mod pool;
pub mod telemetry;

pub use crate::plane::{AnyTransport, CopyConfig, DataPlane, PlaneError};
pub use channel::InstanceChannel;
pub use clock::Clock;
pub use coordinator::{Admission, CoordinatorNode, CoordinatorNodeConfig, CoordinatorSnapshot};
pub use error::{ErrorKind, NodeError};
pub use instance::{
    Delivery, Frame, GuardError, InstanceNode, InstanceNodeConfig, NodeStats, Outcome, Staging,
    TensorView, MAX_TENSORS,
};
pub use metrics::{Metrics, MetricsSnapshot};
pub use tensorferry_core::handshake::coordinator::{CoordinatorConfig, Policy, Timeouts};
pub use tensorferry_core::handshake::instance::{
    Head, InstanceConfig, Prealloc, SGLANG_HEAD_TIMEOUT,
};
/// The table sizes of a node's state machine.
pub use tensorferry_core::handshake::Limits;
pub use tensorferry_core::transport::PoolOwner;
