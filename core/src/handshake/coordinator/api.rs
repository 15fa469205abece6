//! What a coordinator's caller sees: the events it reads, the messages it
//! sends, and the counters.

use super::*;

/// What the coordinator tells its application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorEvent {
    /// An instance registered (`replaced`: a previous session of the same
    /// endpoint was dropped).
    Registered {
        /// Its peer.
        peer: PeerId,
        /// Its role, as an index into the pipeline.
        role: usize,
        /// True if it replaced an earlier session.
        replaced: bool,
    },
    /// A registration was refused: answered with `reason` (`acked`), or
    /// dropped unanswered (an endpoint the admission list does not name,
    /// as sglang's head drops those outside its `--*-urls`).
    Refused {
        /// Who sent it (its work endpoint, on channels that cannot name
        /// senders).
        peer: PeerId,
        /// Why.
        reason: &'static str,
        /// True if the refusal was sent to the registrant.
        acked: bool,
    },
    /// A leg of a request was received and consumed.
    Delivered {
        /// The request.
        id: RequestId,
        /// The leg: its sender's role, as an index into the pipeline.
        leg: usize,
        /// How long it spent in each phase.
        timing: LegTiming,
    },
    /// An instance said it leaves (`transfer_deregister`): with
    /// `draining`, it gets no new work and finishes what it holds;
    /// without, it is gone, and the transfers it was still needed for
    /// failed.
    Deregistered {
        /// Its peer.
        peer: PeerId,
        /// Its role, as an index into the pipeline.
        role: usize,
        /// True: it drains; false: it is gone.
        draining: bool,
        /// Why, as it said (cut to fit).
        reason: Reason,
    },
    /// A leg of a request failed; every instance involved was told.
    Failed {
        /// The request.
        id: RequestId,
        /// The leg: its sender's role, as an index into the pipeline.
        leg: usize,
        /// Why.
        reason: FailReason,
    },
}

/// How long a delivered leg spent in each phase of the handshake, on the
/// coordinator's clock (which sees every phase of every leg, where each
/// instance sees only its own side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LegTiming {
    /// `transfer_staged` received to `transfer_push` sent: waiting for a
    /// receiver with room, its allocation round trip and any retries
    /// included.
    pub queued: Duration,
    /// `transfer_push` sent to `transfer_pushed` received: the sender's
    /// write, and the two messages around it.
    pub written: Duration,
    /// `transfer_ready` sent to `transfer_done` received: the receiving
    /// application's hold of the slot.
    pub consumed: Duration,
}

impl LegTiming {
    /// Staged to ready: the hand-off as the receiver experiences it.
    pub fn to_ready(&self) -> Duration {
        self.queued + self.written
    }
}

/// A message for the caller to send: to whom, and its length in the buffer
/// given to [`Coordinator::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// The peer.
    pub to: PeerId,
    /// Payload bytes written (frame 1; frame 0 is `TRANSFER_MAGIC`).
    pub len: usize,
}

/// Counters for operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Requests staged.
    pub staged: u64,
    /// Requests delivered.
    pub delivered: u64,
    /// Requests failed.
    pub failed: u64,
    /// Hand-offs that took the preallocated-slot fast path.
    pub fast_path: u64,
    /// Forwards received (`transfer_done{staged_for_decoder}`): a leg
    /// delivered and the next staged in one message.
    pub forwarded: u64,
    /// Messages ignored.
    pub ignored: u64,
    /// Registrations refused (answered or dropped).
    pub refused: u64,
    /// Events dropped because the caller did not poll them.
    pub events_dropped: u64,
    /// Messages that could not be queued (transmit queue full).
    pub transmits_dropped: u64,
}
