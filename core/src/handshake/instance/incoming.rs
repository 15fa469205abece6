//! Messages as the control channel delivers them, decoded and handed to
//! the machine, and a peer's departure read against the coordinator's
//! endpoint: what the coordinator's `handle_incoming` and `handle_gone`
//! are on its side.

use super::*;
use crate::transport::Incoming;
use crate::wire::{decode, DecodeError, TRANSFER_MAGIC};

/// Why [`Instance::handle_incoming`] did nothing with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceUnhandled {
    /// A transfer message that does not decode.
    Malformed(DecodeError),
    /// Not a transfer message: the application's own (sglang's work
    /// items), for the caller to pass on.
    Foreign,
    /// Decoded, and ignored for this reason; nothing changed.
    Ignored(Ignored),
}

impl fmt::Display for InstanceUnhandled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "undecodable transfer message: {e}"),
            Self::Foreign => f.write_str("not a transfer message"),
            Self::Ignored(why) => write!(f, "ignored: {why}"),
        }
    }
}

impl core::error::Error for InstanceUnhandled {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Malformed(e) => Some(e),
            _ => None,
        }
    }
}

impl<'s> Instance<'s> {
    /// Its coordinator's endpoint, as it was told it.
    pub fn coordinator(&self) -> &str {
        self.coordinator.as_str()
    }

    /// Handles a message as the control channel delivered it: a transfer
    /// message is decoded and handled as [`handle`](Self::handle) does;
    /// any other frame is the application's ([`InstanceUnhandled::Foreign`]).
    /// `Err` says why nothing was done.
    pub fn handle_incoming(
        &mut self,
        now: Instant,
        msg: &Incoming<'_>,
    ) -> Result<(), InstanceUnhandled> {
        if msg.magic != TRANSFER_MAGIC {
            return Err(InstanceUnhandled::Foreign);
        }
        let decoded = decode(msg.payload).map_err(InstanceUnhandled::Malformed)?;
        self.handle(now, &decoded)
            .map_err(InstanceUnhandled::Ignored)
    }

    /// A peer's connection closed (the channel reports its endpoint): if
    /// it was the coordinator, the instance takes it as lost
    /// ([`handle_coordinator_lost`](Self::handle_coordinator_lost)) and
    /// this returns true; any other peer is no concern of an instance's.
    pub fn handle_gone(&mut self, now: Instant, endpoint: &str) -> bool {
        if endpoint != self.coordinator.as_str() {
            return false;
        }
        self.handle_coordinator_lost(now);
        true
    }
}
