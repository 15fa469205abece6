//! Nodes over a transport that owns no pool, as an embedder's is: each
//! node maps its own (`InstanceNode::start_with_pool`), registers it with
//! the transport, hands off every byte through it, and drops the
//! transport while the pool is still mapped. The transport is the local
//! plane's engine transport (cross-memory attach into registered memory,
//! no pool of its own) behind a wrapper that implements `Transport` only.
// Whether the registered range is still mapped is asked of the kernel
// (`msync`), an FFI call.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tensorferry::runtime::{InstanceNode, InstanceNodeConfig, NodeError};
use tensorferry_local::{LocalConfig, LocalTransport};
use tensorferry_shm::UdsChannel;

use super::{assert_idle, check, coordinator, send, SECOND};
use crate::common::endpoint;
use crate::hooked::{Hooked, Hooks};

/// What the wrapper saw: the ranges it was asked to register, and whether
/// they were all still mapped when it was dropped.
#[derive(Debug, Default)]
struct Seen {
    registered: Vec<(usize, usize)>,
    mapped_at_drop: Option<bool>,
}

/// Hooks that record each range registered, and whether they were all
/// still mapped when the transport was dropped.
struct Recorder(Arc<Mutex<Seen>>);

/// A transport without a pool of its own: a local transport opened as an
/// engine's, whose `PoolOwner` range is empty (which `start` refuses), so
/// a node runs over it only by `start_with_pool`.
type NoPool = Hooked<LocalTransport, Recorder>;

/// A `NoPool` over a fresh local transport, and what it will see.
fn no_pool() -> (NoPool, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let inner = LocalTransport::open(LocalConfig::default()).unwrap();
    let hooks = Recorder(Arc::clone(&seen));
    (Hooked { hooks, inner }, seen)
}

/// True if the kernel maps every page of `addr..addr + len` in this
/// process (`msync` fails with `ENOMEM` over an unmapped page).
fn mapped(addr: usize, len: usize) -> bool {
    // SAFETY: `MS_ASYNC` schedules nothing for an anonymous mapping and
    // touches no byte; over an unmapped range the call only fails.
    unsafe { libc::msync(addr as *mut libc::c_void, len, libc::MS_ASYNC) == 0 }
}

impl Recorder {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Hooks<LocalTransport> for Recorder {
    fn registering(&mut self, addr: *mut u8, len: usize) {
        self.seen().registered.push((addr as usize, len));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let mut seen = self.seen();
        let all = seen.registered.iter().all(|&(a, l)| mapped(a, l));
        seen.mapped_at_drop = Some(all);
    }
}

const POOL: usize = 32 << 20;

fn node(
    role: &str,
    coord: &tensorferry::runtime::CoordinatorNode,
) -> (InstanceNode, Arc<Mutex<Seen>>) {
    let (transport, seen) = no_pool();
    let channel = UdsChannel::bind(&endpoint(role)).unwrap();
    let settings = InstanceNodeConfig::new(role, coord.endpoint());
    let node = InstanceNode::start_with_pool(&settings, POOL, transport, channel).unwrap();
    node.wait_registered(5 * SECOND).unwrap();
    (node, seen)
}

#[test]
fn nodes_over_a_transport_without_a_pool_hand_off_every_byte() {
    let coord = coordinator(&["encoder", "denoiser"]);
    let (enc, enc_seen) = node("encoder", &coord);
    let (den, den_seen) = node("denoiser", &coord);
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        send(&enc, id, i as u8 * 11);
        check(&den, id, i as u8 * 11);
        assert!(enc.next_outcome(5 * SECOND).unwrap().sent);
    }
    assert_idle(&enc);
    assert_idle(&den);
    drop((enc, den));
    for seen in [enc_seen, den_seen] {
        let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        // The node registered one pool of the length asked for ...
        assert_eq!(seen.registered.len(), 1, "{seen:?}");
        assert_eq!(seen.registered[0].1, POOL, "{seen:?}");
        // ... and dropped the transport while it was still mapped.
        assert_eq!(seen.mapped_at_drop, Some(true), "{seen:?}");
    }
}

#[test]
fn a_pool_of_no_bytes_is_refused() {
    let coord = coordinator(&["encoder", "denoiser"]);
    let (transport, seen) = no_pool();
    let channel = UdsChannel::bind(&endpoint("empty")).unwrap();
    let settings = InstanceNodeConfig::new("encoder", coord.endpoint());
    let e = InstanceNode::start_with_pool(&settings, 0, transport, channel).unwrap_err();
    assert!(matches!(e, NodeError::NoPool), "{e}");
    assert!(seen.lock().unwrap().registered.is_empty());
}
