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
    /// Transfers the application held that the coordinator aborted.
    aborted,
    /// Writes posted.
    writes,
    /// Writes that failed.
    write_errors,
    /// Bytes written to peers.
    bytes_written,
    /// Peers found gone (at a coordinator: registered instances whose
    /// connection closed or to which a send found no one; at an instance:
    /// its coordinator).
    peers_lost,
}

impl Metrics {
    /// Counts (and logs, sparingly) a transfer message that did not decode.
    pub(crate) fn malformed(&self, from: &str, via: &str, e: &tensorferry_core::wire::DecodeError) {
        let n = self.bad_frames.fetch_add(1, Ordering::Relaxed);
        // The first ten, then one in a thousand: a peer that sends
        // garbage costs a counter, not the log.
        if n < 10 || n % 1000 == 0 {
            let from = if from.is_empty() {
                "(not named by the channel)"
            } else {
                from
            };
            tracing::warn!(from, via, error = %e, bad_frames = n + 1, "undecodable transfer message dropped");
        }
    }

    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
