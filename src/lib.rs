//! ferry: tensor transfer for disaggregated diffusion serving.
//!
//! The library to embed: the std runtime ([`runtime`]) that drives
//! tensorferry-core's state machines over a data plane and a ZeroMQ or
//! Unix-socket control channel, the transfer engine below it
//! ([`engine`]), the data planes both run on, named by one type
//! ([`plane`]: cross-memory attach and shared memory always; libfabric
//! and ibverbs behind the `fabric` and `verbs` features), and fault
//! injection around any of them ([`fault`]). The protocol itself (messages, codec, slot
//! accounting, the handshake state machines) lives in [`tensorferry_core`],
//! re-exported here as [`core`]. The `ferry` command, its pipeline and its
//! benchmarks are applications of this crate (`cli/`, `bench/`).
// Unsafe code only where the runtime views registered pool memory
// (`runtime::memory`, `runtime::instance`) and where a wrapper forwards
// the transport's promise that it owns its pool (`PoolOwner` in
// `plane::any` and `fault`), where a node pairs a transport that owns no
// pool with one it maps (`runtime::pool`), and where the engine registers
// its caller's memory with a data plane (`engine`, `engine::driven`),
// each with its SAFETY argument.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub use tensorferry_core as core;

/// `Debug` for a node or a handle that shows what names it and leaves the
/// rest out (`finish_non_exhaustive`): `debug_naming!(Type, |this| {
/// "name": expr, .. })`, each `expr` reading `this`. A macro because it is
/// the same impl for several types; `this` stands for `self`, which a
/// `macro_rules!` cannot take from its caller.
macro_rules! debug_naming {
    ($ty:ident, |$this:ident| { $($name:literal: $value:expr),+ $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $this = self;
                f.debug_struct(stringify!($ty))
                    $(.field($name, &$value))+
                    .finish_non_exhaustive()
            }
        }
    };
}

pub mod engine;
pub mod fault;
pub mod plane;
pub mod runtime;

/// The README's code, compiled and run as doc tests so that it cannot
/// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The book's chapters with Rust code (docs/src/), run as doc tests as the
/// README is: "The protocol" (the wire codec).
#[cfg(doctest)]
#[doc = include_str!("../docs/src/protocol.md")]
pub struct BookProtocolDoctests;

/// "Embedding from Rust" (the runtime's nodes, the transfer engine).
#[cfg(doctest)]
#[doc = include_str!("../docs/src/rust.md")]
pub struct BookRustDoctests;
