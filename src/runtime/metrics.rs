//! Counters of a running node, readable from any thread.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! metrics {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Live counters.
        #[derive(Debug, Default)]
        pub struct Metrics {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// Counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Metrics {
            /// The counters now.
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                }
            }
        }
    };
}

metrics! {
    /// Control messages received.
    messages_in,
    /// Control messages sent.
    messages_out,
    /// Control messages the state machine ignored (late, duplicated, not
    /// for this peer).
    ignored,
    /// Frames dropped: not decodable, too large, malformed.
    bad_frames,
    /// Frames that were not transfer messages (left to the application).
    non_transfer,
    /// Sends that failed.
    send_errors,
    /// Requests staged and committed.
    staged,
    /// Requests written to their receiver.
    sent,
    /// Requests that failed before reaching their receiver.
    send_failed,
    /// Transfers received.
    received,
    /// Transfers released by the application.
    released,
    /// Writes posted.
    writes,
    /// Writes that failed.
    write_errors,
    /// Bytes written to peers.
    bytes_written,
    /// Peers found gone.
    peers_lost,
}

impl Metrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
