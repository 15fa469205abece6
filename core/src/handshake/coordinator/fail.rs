//! Why a request failed: one table of reasons, with the code metrics and
//! logs label them by and the text `transfer_abort` carries.

use core::fmt;

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailReason {
    /// No receiver had room within the queue timeout.
    QueueTimeout,
    /// The receiver did not answer `transfer_alloc` in time.
    AllocTimeout,
    /// The sender did not report its write in time.
    PushTimeout,
    /// The receiver did not report `transfer_done` in time.
    DoneTimeout,
    /// The receiver could not allocate, for good or too often.
    Rejected,
    /// The sender's write failed.
    WriteFailed,
    /// The receiver reported an error in `transfer_done`.
    ReceiverError,
    /// An instance involved went away or registered again.
    PeerGone,
    /// The sender's role is the last of the pipeline.
    NoNextRole,
    /// The coordinator's transfer table is full.
    TableFull,
    /// Manifest and scalar fields exceed the storage of one transfer.
    TooLarge,
    /// The receiver answered with a slot that cannot hold the data.
    BadSlot,
    /// The request id is taken: another sender's request of the same leg
    /// holds it, or ended under it lately (ids must be unique, across
    /// restarts too).
    IdReused,
    /// An instance involved left (`transfer_deregister`), its drain over.
    PeerLeft,
    /// The coordinator shuts down, or drains and takes no new transfer.
    ShuttingDown,
}

/// Every reason, in declaration order, with its code (snake_case, for
/// metric labels and logs) and its text (as `transfer_abort` sends it).
const TABLE: [(FailReason, &str, &str); 15] = [
    (
        FailReason::QueueTimeout,
        "queue_timeout",
        "timeout waiting for a receiver",
    ),
    (
        FailReason::AllocTimeout,
        "alloc_timeout",
        "timeout waiting for transfer_allocated",
    ),
    (
        FailReason::PushTimeout,
        "push_timeout",
        "timeout waiting for transfer_pushed",
    ),
    (
        FailReason::DoneTimeout,
        "done_timeout",
        "timeout waiting for transfer_done",
    ),
    (
        FailReason::Rejected,
        "rejected",
        "receiver rejected the allocation",
    ),
    (FailReason::WriteFailed, "write_failed", "write failed"),
    (
        FailReason::ReceiverError,
        "receiver_error",
        "receiver reported an error",
    ),
    (FailReason::PeerGone, "peer_gone", "instance went away"),
    (
        FailReason::NoNextRole,
        "no_next_role",
        "no role after the sender's",
    ),
    (
        FailReason::TableFull,
        "table_full",
        "coordinator transfer table full",
    ),
    (
        FailReason::TooLarge,
        "too_large",
        "manifest and scalar fields too large",
    ),
    (
        FailReason::BadSlot,
        "bad_slot",
        "receiver's slot cannot hold the data",
    ),
    (
        FailReason::IdReused,
        "id_reused",
        "request id already used by another request of this leg",
    ),
    (FailReason::PeerLeft, "peer_left", "instance left"),
    (
        FailReason::ShuttingDown,
        "shutting_down",
        "coordinator shutting down",
    ),
];

impl FailReason {
    /// Every reason, for tables indexed by [`index`](Self::index).
    pub const ALL: [FailReason; TABLE.len()] = {
        let mut all = [FailReason::QueueTimeout; TABLE.len()];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].0;
            i += 1;
        }
        all
    };

    /// Its position in [`ALL`](Self::ALL).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The reason as sent in `transfer_abort`.
    pub const fn as_str(self) -> &'static str {
        TABLE[self.index()].2
    }

    /// A short snake_case name, for metric labels and logs.
    pub const fn code(self) -> &'static str {
        TABLE[self.index()].1
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_declaration_order() {
        for (i, (reason, _, _)) in TABLE.iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
        }
    }
}
