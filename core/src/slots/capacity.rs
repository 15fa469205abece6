//! The coordinator's per-instance capacity counter: how many transfers an
//! instance may have in flight, taken by ticket and released by giving the
//! ticket back, so a request releases its capacity exactly once.

use core::fmt;

/// Why capacity could not be taken or released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CapacityError {
    /// Every unit is in use.
    Full {
        /// The limit.
        limit: u32,
    },
    /// The ticket was issued by another counter.
    WrongCounter {
        /// The ticket's counter.
        ticket: u32,
        /// This counter.
        counter: u32,
    },
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Full { limit } => write!(f, "all {limit} transfer slots of the instance in use"),
            Self::WrongCounter { ticket, counter } => {
                write!(
                    f,
                    "capacity ticket of counter {ticket} returned to counter {counter}"
                )
            }
        }
    }
}

impl core::error::Error for CapacityError {}

/// One unit of an instance's capacity, held by a request. Not `Clone`:
/// releasing it consumes it, so it is released at most once; it is
/// `#[must_use]` so that dropping it unreleased is a warning.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a capacity ticket that is dropped is never released"]
pub struct CapacityTicket {
    counter: u32,
}

/// A capacity counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    id: u32,
    limit: u32,
    in_use: u32,
    acquired: u64,
    released: u64,
    refused: u64,
}

impl Capacity {
    /// A counter named `id` (tickets carry it) allowing `limit` units.
    pub const fn new(id: u32, limit: u32) -> Self {
        Self {
            id,
            limit,
            in_use: 0,
            acquired: 0,
            released: 0,
            refused: 0,
        }
    }

    /// Takes one unit.
    pub fn acquire(&mut self) -> Result<CapacityTicket, CapacityError> {
        if self.in_use >= self.limit {
            self.refused += 1;
            return Err(CapacityError::Full { limit: self.limit });
        }
        self.in_use += 1;
        self.acquired += 1;
        Ok(CapacityTicket { counter: self.id })
    }

    /// Gives a unit back. A ticket of another counter is refused and
    /// nothing changes here; the ticket is consumed either way, since it is
    /// a bug to hold it against the wrong counter.
    pub fn release(&mut self, ticket: CapacityTicket) -> Result<(), CapacityError> {
        if ticket.counter != self.id {
            return Err(CapacityError::WrongCounter {
                ticket: ticket.counter,
                counter: self.id,
            });
        }
        self.in_use -= 1;
        self.released += 1;
        Ok(())
    }

    /// Changes the limit; units in use above a lowered limit stay until
    /// released.
    pub fn set_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Units in use.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Units free now.
    pub fn available(&self) -> u32 {
        self.limit.saturating_sub(self.in_use)
    }

    /// Units ever acquired.
    pub fn acquired(&self) -> u64 {
        self.acquired
    }

    /// Units ever released.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Acquisitions refused because the counter was full.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}
