//! ferry: tensor transfer for disaggregated diffusion serving.
//!
//! The root package holds the std side of ferry: the `ferry` command-line
//! tool and what it shares with benchmarks and tests. The protocol itself
//! (messages, codec, and, as they land, slot accounting and the handshake
//! state machines) lives in [`ferry_core`], re-exported here as [`core`].
// Unsafe code only where the runtime views registered pool memory
// (`runtime::memory`), each block with its SAFETY argument.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub use ferry_core as core;

pub mod control_bench;
#[cfg(feature = "fabric")]
pub mod fabric_bench;
pub mod fault;
pub mod handoff_bench;
pub mod handshake_bench;
pub mod pipeline;
pub mod runtime;
pub mod slots_bench;
pub mod wire_bench;
pub mod wire_text;

/// The README's code, compiled and run as doc tests so that it cannot
/// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
