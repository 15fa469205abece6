//! An instance node's configuration: the core's, extended.

use super::*;

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
}
