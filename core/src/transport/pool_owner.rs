//! The promise a data plane makes when it owns the pool a node receives
//! into: the node reads and writes that memory through views it makes
//! itself, so the memory must live exactly as long as the transport.
//! Ferry's own planes make it (their pools are shared-memory segments or
//! registered for RDMA as they are opened); a transport that owns no
//! pool, an embedder's, does not need to: the runtime maps a pool for it
//! (`InstanceNode::start_with_pool`).
// Declaring an unsafe trait is the point of this module: its implementors
// (next to each pool, in the data planes' crates) make the promise.
#![allow(unsafe_code)]

/// A data plane that owns the memory of its pool: a node takes its view of
/// the pool from the transport it keeps, so that the memory lives exactly
/// as long as the node does.
///
/// # Safety
/// Implementors promise that `pool_ptr()..pool_ptr() + pool_len()` is
/// mapped, readable and writable, and the same range at every call, for as
/// long as the value lives, whatever of its methods (its
/// [`Transport`](super::Transport) methods included) are called and
/// wherever it is moved: the mapping is owned by the value and released
/// only when it is dropped. A wrapper that owns the transport it forwards
/// to may promise what that transport promised.
pub unsafe trait PoolOwner {
    /// The pool's first byte.
    fn pool_ptr(&self) -> *mut u8;
    /// Its length in bytes (zero: no pool, which a node refuses).
    fn pool_len(&self) -> usize;
}
