//! How a coordinator behaves ([`CoordinatorConfig`]), with ferry's
//! defaults, and the errors of a configuration or storage it refuses.

use super::*;

/// How long each wait may last before the request fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Staged, waiting for a receiver with room.
    pub queued: Duration,
    /// `transfer_alloc` sent, waiting for `transfer_allocated` or a reject.
    pub alloc: Duration,
    /// `transfer_push` sent, waiting for `transfer_pushed`. Must exceed the
    /// data plane's own write timeout plus the control plane's delay, so
    /// that no write lands after the request failed.
    pub push: Duration,
    /// `transfer_ready` sent, waiting for `transfer_done`.
    pub done: Duration,
}

/// How a receiver is chosen among the instances of the next role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// In turn, skipping instances without capacity.
    RoundRobin,
    /// The instance with the most free preallocated slots that fit, then
    /// the most free capacity.
    MostFreeSlots,
}

/// How a coordinator behaves: receiver choice, capacity, timeouts and
/// retries. One value describes a coordinator for every layer: the
/// runtime, the command line and Python extend it (with a pipeline,
/// endpoints, table sizes), never copy it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Receiver choice.
    pub policy: Policy,
    /// Transfers an instance may receive at once.
    pub capacity_per_instance: u32,
    /// Per-phase timeouts.
    pub timeouts: Timeouts,
    /// Wait before re-dispatching after a retryable reject (times the
    /// attempt number).
    pub retry_backoff: Duration,
    /// Dispatch attempts before a request fails.
    pub max_attempts: u32,
    /// How long a preallocated slot of a request that failed mid-write
    /// stays out of use, at least: the coordinator keeps it out longer
    /// where the failed request's sender's writes may land later (its
    /// `write_lifetime_ms` plus [`message_delay`](Self::message_delay)).
    pub quarantine: Duration,
    /// The longest a control message may take to arrive: a
    /// `transfer_push` delivered this late is written this late, after its
    /// request may have failed.
    pub message_delay: Duration,
    /// The longest write lifetime (`write_lifetime_ms`) a registration may
    /// state: one beyond it is refused, so that no instance parks the
    /// receivers' slots for longer than the operator allows.
    pub max_write_lifetime: Duration,
    /// How long a preallocated slot of a request that failed while its
    /// receiver held the data waits for the receiver's late
    /// `transfer_done` before it is reused anyway.
    pub late_done_wait: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self::FERRY
    }
}

impl CoordinatorConfig {
    /// ferry's defaults: the instance with the most free preallocated
    /// slots first, 16 transfers at once per instance, and a full receiver
    /// retried for about 25 s (20 ms × 1..50), within the queue timeout.
    pub const FERRY: Self = Self {
        policy: Policy::MostFreeSlots,
        capacity_per_instance: 16,
        timeouts: Timeouts {
            queued: Duration::from_secs(30),
            alloc: Duration::from_secs(2),
            push: Duration::from_secs(10),
            done: Duration::from_secs(60),
        },
        retry_backoff: Duration::from_millis(20),
        max_attempts: 50,
        quarantine: Duration::from_secs(1),
        message_delay: Duration::from_secs(1),
        max_write_lifetime: Duration::from_secs(120),
        late_done_wait: Duration::from_secs(5),
    };
}

/// Bad coordinator settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The pipeline has no role, more than 8, or a role twice.
    Pipeline,
    /// A pipeline role's name is longer than [`ROLE_LEN`] bytes.
    RoleTooLong,
    /// No transfer storage.
    NoTransfers,
    /// The receivers' ranking has room for fewer roles than the pipeline
    /// has, or for fewer members than the member table (it needs as many
    /// entries per role as members, and a place per member).
    RankingTooSmall,
    /// An admission names a role not in the pipeline.
    UnknownRole,
    /// An admitted endpoint is longer than an endpoint the coordinator
    /// keeps.
    EndpointTooLong,
    /// The admission list is full.
    AdmissionFull,
    /// The peer table has places, but not more than the member table: a
    /// stranger could find none to take over.
    PeerTableTooSmall,
    /// Storage not as long as its part needs
    /// ([`CoordinatorStorage::storage_needed`](super::CoordinatorStorage::storage_needed)).
    Storage(StorageError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Self::Storage(e) = self {
            return write!(f, "{e}");
        }
        f.write_str(match self {
            Self::Pipeline => "the pipeline must have 1 to 8 roles, each once",
            Self::RoleTooLong => "a pipeline role's name is longer than 64 bytes",
            Self::NoTransfers => "the transfer table is empty",
            Self::RankingTooSmall => {
                "the receivers' ranking storage holds fewer roles than the pipeline has"
            }
            Self::UnknownRole => "an admitted endpoint names a role not in the pipeline",
            Self::EndpointTooLong => "an admitted endpoint is longer than 128 bytes",
            Self::AdmissionFull => "the admission list is full (more entries than members)",
            Self::PeerTableTooSmall => {
                "the peer table must have more places than the member table (or none)"
            }
            Self::Storage(_) => "storage of the wrong size",
        })
    }
}

impl core::error::Error for ConfigError {}
