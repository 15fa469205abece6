//! The sizes of a state machine's tables, for the storage it owns
//! (`InstanceStorage::owned`, `CoordinatorStorage::owned`).

/// Table sizes of a state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests (instance) or transfers (coordinator) in flight at once.
    pub requests: usize,
    /// Bytes of manifest plus scalar fields one request may carry.
    pub nested_per_request: usize,
    /// Ended requests remembered, to ignore late duplicates.
    pub tombstones: usize,
    /// Instances a coordinator may have registered at once.
    pub members: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            requests: 128,
            nested_per_request: 16 * 1024,
            tombstones: 4096,
            members: 64,
        }
    }
}
