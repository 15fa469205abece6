//! The pipeline's processes: a coordinator, and instances of each role.
//! Each reports on stdout, one JSON object per line, and runs until SIGTERM
//! or SIGINT (or, with `--exit-on-stdin-close`, until its stdin closes);
//! then it drains (`stopping.rs`), prints its summary and exits.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tensorferry_core::handshake::coordinator::CoordinatorEvent;
use tensorferry_core::handshake::instance::InstanceError;
use tensorferry_core::json::RawJson;
use tensorferry_core::transport::ControlChannel;
use tensorferry_shm::UdsChannel;
use tensorferry_zmq::{ZmqChannel, ZmqConfig};

use super::data;
use super::sglang::{self, SglangRole, SglangTally};
use super::stopping::{await_registration, stop_coordinator, Ending};
use crate::lifetime::Lifetime;
use serde_json::json;
use tensorferry::runtime::telemetry::Telemetry;
use tensorferry::runtime::Prealloc;
use tensorferry::runtime::{
    CoordinatorNode, CoordinatorNodeConfig, Delivery, InstanceNode, InstanceNodeConfig, NodeError,
    Staging,
};

use crate::metrics_http::{MetricsServer, Readiness};

mod coordinator;
mod instance;
mod payload;

use coordinator::*;
pub use coordinator::{coordinator, CoordinatorProcessConfig, DRAIN_TIMEOUT};
use instance::*;
pub use instance::{instance, role_prealloc, InstanceProcessConfig};
use payload::*;
pub(crate) use payload::{forward_denoised, stage_with_patience};

/// The control plane the processes talk over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Control {
    /// Unix seqpacket sockets (one host).
    Uds,
    /// ZeroMQ with sglang's layout: PULL bound per process (and per role
    /// at the coordinator), PUSH to peers; ipc:// or tcp:// endpoints.
    Zmq,
}

/// The data plane an instance writes and receives over: the library's.
pub use tensorferry::runtime::DataPlane;

/// What an instance sends and what it checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Workload {
    /// The pipeline's tensors: prompt embeddings and latents, forwarded by
    /// denoisers.
    #[default]
    Pipeline,
    /// One `uint8` tensor per request of a random size (seeded, from one
    /// byte to `max_bytes`);
    /// receivers check every byte and release (no forwarding).
    Random {
        /// Seeds the sizes (sender and receivers must agree).
        seed: u64,
        /// The largest size.
        max_bytes: u64,
    },
    /// sglang's roles under sglang's head (see `sglang.rs`): the encoder
    /// stages for the work items the head dispatches, denoisers check and
    /// forward, the decoder checks and returns an output tensor.
    Sglang,
}

/// The pipeline's roles, in hand-off order.
pub const PIPELINE: [&str; 3] = ["encoder", "denoiser", "decoder"];

/// Prints one JSON object as a line (serde_json writes it: ids and errors
/// from peers are escaped), flushed at once: the launcher reads it as it
/// comes.
pub(crate) fn emit_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Nanoseconds on the wall clock (all processes are on one host).
fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Takes over SIGTERM and SIGINT (and stdin's end, if asked), or says why
/// it cannot.
fn lifetime(exit_on_stdin_close: bool) -> Result<Lifetime, ExitCode> {
    Lifetime::start(exit_on_stdin_close).map_err(|e| fail("signals", e))
}

fn fail(what: &str, e: impl std::fmt::Display) -> ExitCode {
    emit_json(&json!({"event": "error", "what": what, "error": e.to_string()}));
    ExitCode::FAILURE
}
