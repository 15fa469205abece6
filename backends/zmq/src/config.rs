//! The socket options the channel sets, chosen on purpose.

use std::time::Duration;

/// Socket options, chosen on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZmqConfig {
    /// Messages queued per peer before sends wait (ZMQ_SNDHWM).
    pub send_hwm: i32,
    /// Messages queued per receiving socket (ZMQ_RCVHWM).
    pub recv_hwm: i32,
    /// How long a send waits on a full queue before it fails.
    pub send_timeout: Duration,
    /// How long closing waits for queued messages to go out (ZMQ_LINGER).
    pub linger: Duration,
    /// Largest message a peer may send before ZeroMQ drops its
    /// connection (ZMQ_MAXMSGSIZE): a guard against memory exhaustion.
    pub max_message: i64,
    /// First reconnection attempt after a peer goes away.
    pub reconnect: Duration,
}

impl Default for ZmqConfig {
    fn default() -> Self {
        Self {
            send_hwm: 10_000,
            recv_hwm: 10_000,
            send_timeout: Duration::from_millis(100),
            linger: Duration::from_secs(2),
            max_message: 64 << 20,
            reconnect: Duration::from_millis(50),
        }
    }
}

/// A duration as ZeroMQ's milliseconds option, saturating.
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}
