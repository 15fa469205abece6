//! The handshake state machines: the coordinator (sglang's DiffusionServer
//! side of the transfer protocol) and the instances (senders and receivers).
//!
//! Both are sans-IO, in the style of quinn-proto: they never block, read a
//! clock or allocate. The caller feeds them messages and time
//! (`handle(now, from, msg)`, `handle_timeout(now)`, and on instances
//! `handle_completion`), and drains what they want done: messages to send
//! (`poll_transmit`), writes to post (`poll_action`, instances), things the
//! application should know (`poll_event`), and when to call back
//! (`poll_timeout`). Every table is of fixed size, the caller's storage or
//! (feature `alloc`) the machine's own; a full table is a typed error,
//! answered on the wire where a peer waits.

mod common;
pub mod coordinator;
pub mod instance;
mod limits;
mod parts;
mod ring;
pub mod tables;

pub use common::{
    Ignored, Instant, Leg, Name, PeerId, Reason, RequestId, Side, Text, TextTooLong, Tombstone,
    ID_LEN, NAME_LEN, REASON_LEN,
};
pub use limits::{Limits, LimitsError, StorageError};
pub use parts::{
    GraveyardSizes, GraveyardStorage, HeapSizes, HeapStorage, RequestsSizes, RequestsStorage,
};
pub use ring::Ring;
pub use tables::{HashKey, TableSizes, TableStorage};
