//! The one world the core's handshake tests drive: a [`World`] of a
//! coordinator and instances (the core's sans-IO machines, built over
//! owned tables), a virtual clock with the timers of every machine, and a
//! [`Wire`] between them that decides the fate of every control message
//! and every write:
//!
//! * [`Lossless`]: every message once, in order, at once; writes complete
//!   at once (or are held for the test). The path tests
//!   (`core/tests/handshake_paths`) walk it.
//! * [`Faulty`]: the core's [`FaultPlan`] applied on the virtual clock:
//!   messages lost, duplicated, delayed and so reordered, writes that
//!   fail, land late or are never reported, senders that crash after
//!   posting. The simulation (`core/tests/handshake_sim.rs`) runs it.
//! * [`Bytes`]: the fuzzer's bytes choose each message's and each write's
//!   fate (`core/fuzz/fuzz_targets/handshake.rs`).
//!
//! A driver adds what is its own: the path tests their steps and
//! assertions, the simulation its data plane, applications and ledger (as
//! events of its own on the world's clock), the fuzz target its injected
//! messages. An unpublished crate, so that the fuzz crate (outside the
//! workspace) and the core's integration tests share it without the core
//! carrying a test apparatus.
//!
//! [`FaultPlan`]: tensorferry_core::fault_plan::FaultPlan

pub mod machines;
mod queue;
mod wire;
mod world;

pub use machines::*;
pub use wire::{Bytes, Faulty, Lossless, Posting, Rng, Wire, WriteFate, MS};
pub use world::World;
