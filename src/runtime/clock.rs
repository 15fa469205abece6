//! The state machines' time: nanoseconds since the node started.

use std::time::{Duration, Instant as StdInstant};

use tensorferry_core::handshake::Instant;

/// A monotonic clock with a per-node epoch.
#[derive(Clone, Copy, Debug)]
pub struct Clock(StdInstant);

impl Clock {
    /// A clock starting now.
    pub fn start() -> Self {
        Self(StdInstant::now())
    }

    /// Now, as the state machines count.
    pub fn now(&self) -> Instant {
        Instant(self.0.elapsed().as_nanos() as u64)
    }

    /// How long from now until `t` (zero if past), at most `cap`.
    pub fn until(&self, t: Option<Instant>, cap: Duration) -> Duration {
        match t {
            Some(t) => Duration::from_nanos(t.0.saturating_sub(self.now().0)).min(cap),
            None => cap,
        }
    }
}
