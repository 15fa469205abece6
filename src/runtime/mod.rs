//! The std runtime: ferry-core's state machines driven over a control
//! channel and a data plane, each by a progress thread, with the API a
//! serving runtime embeds.
//!
//! * [`InstanceNode`]: stage a request's tensors and commit them; receive
//!   transfers as typed tensor views over the slot; release them.
//! * [`CoordinatorNode`]: the coordinator, relaying between instances.
//! * [`shm`]: both over the shared-memory loopback and Unix sockets.
//! * `fabric` (cargo feature `fabric`): instances over a libfabric data
//!   plane (EFA, verbs, tcp, shm providers).
//! * `verbs` (cargo feature `verbs`): instances over RC queue pairs on an
//!   InfiniBand or RoCE NIC.
//!
//! Every hand-off is traced (`tracing`, target `ferry`), counted
//! ([`MetricsSnapshot`]) and timed ([`telemetry`], which also serves it
//! all to Prometheus).

mod clock;
mod coordinator;
mod error;
#[cfg(feature = "fabric")]
pub mod fabric;
mod instance;
mod memory;
mod metrics;
#[cfg(any(feature = "fabric", feature = "verbs"))]
pub mod owned;
pub mod shm;
pub mod telemetry;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use clock::Clock;
pub use coordinator::{Admission, CoordinatorNode, CoordinatorSettings, CoordinatorSnapshot};
pub use error::NodeError;
pub use ferry_core::handshake::coordinator::{CoordinatorConfig, Policy, Timeouts};
pub use ferry_core::handshake::instance::{Head, InstanceConfig, Prealloc, SGLANG_HEAD_TIMEOUT};
/// The table sizes of a node's state machine.
pub use ferry_core::handshake::Limits;
pub use instance::{
    Delivery, Frame, InstanceNode, InstanceSettings, NodeStats, Outcome, Staging, TensorView,
    MAX_TENSORS,
};
pub use memory::PoolMemory;
pub use metrics::{Metrics, MetricsSnapshot};
