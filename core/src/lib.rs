//! tensorferry-core: the allocation-free heart of ferry.
//!
//! This crate is `#![no_std]` and, without its `alloc` feature, never
//! allocates. It holds what every ferry process shares regardless of
//! fabric:
//!
//! * [`json`]: a bounded, iterative JSON lexer and the Python-compatible
//!   writer that the wire codec is built on;
//! * [`wire`]: the transfer protocol's messages (`transfer_*`), decoded by
//!   borrowing from the frame and encoded byte-identically to the seed's
//!   `encode_transfer_msg`;
//! * [`slots`]: slot accounting: the buddy allocator over a pool, tensor
//!   layout and manifest checks, preallocated receive slots, capacity;
//! * [`handshake`]: the coordinator's and the instances' state machines;
//! * [`transport`]: the seams to the outside: the data plane's `Transport`
//!   and the control channel's `ControlSend` and `ControlRecv`;
//! * [`managed`]: the tables the machines keep, borrowed from the caller
//!   or, with the `alloc` feature, owned (`InstanceStorage::owned`,
//!   `CoordinatorStorage::owned`, sized by `handshake::Limits`);
//! * [`fault_plan`]: what faults to inject, one description for the
//!   runtime's fault injector and the simulation's faulty wire.
//!
//! Everything here is sans-IO: bytes come in as slices, bytes go out into
//! caller buffers, and a buffer that is too small is reported with the size
//! that would have been needed.
#![no_std]
// Unsafe code is denied; `transport` declares (never uses) one unsafe fn
// (`Transport::register`) and one unsafe trait (`PoolOwner`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod fault_plan;
pub mod handshake;
pub mod json;
pub mod managed;
pub mod slots;
pub mod transport;
pub mod wire;
