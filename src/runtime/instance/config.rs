//! An instance node's configuration: the core's, extended.

use super::*;
use tensorferry_core::handshake::instance::Head;

/// An instance node's configuration: the core's [`InstanceConfig`]
/// (timeouts, preallocated slots, the head it serves under), extended by
/// what a node needs besides: its role, its coordinator, its tables.
#[derive(Clone, Debug)]
pub struct InstanceNodeConfig {
    /// The role it registers as (`encoder`, `denoiser`, ...).
    pub role: String,
    /// The coordinator's endpoint.
    pub coordinator: String,
    /// Table sizes.
    pub limits: Limits,
    /// How the instance behaves ([`InstanceConfig::FERRY`] by default;
    /// [`InstanceConfig::under_sglang`] under sglang's head).
    pub config: InstanceConfig,
}

impl InstanceNodeConfig {
    /// Settings with ferry's defaults for `role`, reporting to
    /// `coordinator`.
    pub fn new(role: &str, coordinator: &str) -> Self {
        Self {
            role: role.to_owned(),
            coordinator: coordinator.to_owned(),
            limits: Limits::INSTANCE,
            config: InstanceConfig::FERRY,
        }
    }

    /// This configuration for serving under sglang's head, whose only timeout
    /// is `head_timeout` ([`InstanceConfig::under_sglang`]).
    pub fn under_sglang(mut self, head_timeout: Duration) -> Self {
        self.config = self.config.under_sglang(head_timeout);
        self
    }

    /// Refuses a guard its control channel cannot serve this instance
    /// under (see [`GuardError`]); whoever binds the channel asks.
    pub fn check_guard(&self, guard: &tensorferry_zmq::Guard) -> Result<(), GuardError> {
        let Some(curve) = &guard.curve else {
            return Ok(());
        };
        if self.config.head == Head::Sglang {
            return Err(GuardError::UnderSglang);
        }
        match curve.peers.len() {
            1 => Ok(()),
            n => Err(GuardError::NotOneCoordinatorKey(n)),
        }
    }
}

/// Why an instance cannot serve behind a [`Guard`](tensorferry_zmq::Guard).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// CURVE under sglang's head, whose sockets speak plain ZeroMQ: it
    /// could reach no endpoint of the instance, nor the instance its.
    #[error("CURVE cannot apply under sglang's head, which speaks plain ZeroMQ; guard that head's instances with the allow-list alone")]
    UnderSglang,
    /// CURVE admitting other than one key: an instance's one peer is its
    /// coordinator, whose key it also connects with.
    #[error("an instance admits one CURVE key, its coordinator's (the key it connects with); {0} were given")]
    NotOneCoordinatorKey(usize),
}
