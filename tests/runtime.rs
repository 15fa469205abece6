//! The std runtime over real parts: a coordinator and instances as threads
//! of this process, talking over Unix sockets and writing into each other's
//! shared-memory pools. The tests are in `runtime/`, one module a topic;
//! the nodes and the requests they share are here.

mod common;
#[path = "common/hooked.rs"]
mod hooked;

#[path = "runtime/blocked_send.rs"]
mod blocked_send;
#[path = "runtime/faults.rs"]
mod faults;
#[path = "runtime/hand_offs.rs"]
mod hand_offs;
#[path = "runtime/own_pool.rs"]
mod own_pool;

use std::time::Duration;

use common::{coordinator, coordinator_with, endpoint};
use tensorferry::runtime::{
    CoordinatorNode, DataPlane, InstanceNode, InstanceNodeConfig, Prealloc,
};

use tensorferry_core::slots::{Dtype, TensorSpec};

const SECOND: Duration = Duration::from_secs(1);

/// `count` preallocated receive slots of 1 MiB each.
fn mib_slots(count: usize) -> Prealloc {
    Prealloc {
        count,
        size: 1 << 20,
    }
}

/// Waits for the coordinator to have seen `n` deliveries.
fn wait_delivered(coord: &CoordinatorNode, n: u64) {
    for _ in 0..500 {
        if coord.snapshot().stats.delivered >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{:?}", coord.snapshot());
}

fn instance(role: &str, coord: &CoordinatorNode, prealloc: Prealloc) -> InstanceNode {
    let mut s = InstanceNodeConfig::new(role, coord.endpoint());
    s.config.prealloc = prealloc;
    let node = DataPlane::default()
        .start_instance_at(&s, 64 << 20, &endpoint(role))
        .unwrap();
    node.wait_registered(5 * SECOND).unwrap();
    node
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Stages one request with two tensors filled from `seed`.
fn send(node: &InstanceNode, id: &str, seed: u8) {
    let (a, b) = ([1u64, 77, 33], [5u64, 1000]);
    let specs = [
        TensorSpec {
            field: "prompt_embeds",
            list_index: None,
            shape: &a,
            dtype: Dtype::BFloat16,
            byte_len: 2 * 77 * 33,
        },
        TensorSpec {
            field: "latents",
            list_index: Some(0),
            shape: &b,
            dtype: Dtype::Float32,
            byte_len: 4 * 5000,
        },
    ];
    let mut staging = node.stage(id, &specs).unwrap();
    for i in 0..2 {
        let t = staging.tensor_mut(i).unwrap();
        let p = pattern(seed.wrapping_add(i as u8), t.len());
        t.copy_from_slice(&p);
    }
    staging
        .commit(r#"{"prompt":"a fox","steps":30,"cfg":7.5}"#)
        .unwrap();
}

/// Receives request `id` and checks every byte against `seed`.
fn check(node: &InstanceNode, id: &str, seed: u8) {
    let d = node.recv(5 * SECOND).expect("a delivery");
    assert_eq!(d.id(), id);
    check_bytes(&d, seed);
    d.release();
}

/// Receives one delivery for each `(id, seed)` of `expected`, in whatever
/// order they arrive (a request sent into a preallocated slot may overtake
/// one that waits for its slot), and checks every byte of each.
#[cfg(feature = "verbs-sim")]
fn check_all(node: &InstanceNode, expected: &[(String, u8)]) {
    let mut left: Vec<&(String, u8)> = expected.iter().collect();
    while !left.is_empty() {
        let d = node.recv(5 * SECOND).expect("a delivery");
        let at = left
            .iter()
            .position(|(id, _)| id == d.id())
            .unwrap_or_else(|| panic!("{} arrived; expected one of {left:?}", d.id()));
        check_bytes(&d, left.swap_remove(at).1);
        d.release();
    }
}

/// Checks every byte of a delivery made by [`send`] with `seed`.
fn check_bytes(d: &tensorferry::runtime::Delivery<'_>, seed: u8) {
    assert_eq!(
        d.scalar_fields(),
        r#"{"prompt":"a fox","steps":30,"cfg":7.5}"#
    );
    let tensors: Vec<_> = d.tensors().collect();
    assert_eq!(tensors.len(), 2);
    assert_eq!(tensors[0].field.raw(), "prompt_embeds");
    assert_eq!(tensors[0].dtype, Dtype::BFloat16);
    assert_eq!(tensors[0].dims().collect::<Vec<_>>(), [1, 77, 33]);
    assert_eq!(
        (tensors[1].field.raw(), tensors[1].list_index),
        ("latents", Some(0))
    );
    for (i, t) in tensors.iter().enumerate() {
        assert_eq!(t.bytes, pattern(seed.wrapping_add(i as u8), t.bytes.len()));
    }
}

fn assert_idle(node: &InstanceNode) {
    for _ in 0..200 {
        let s = node.stats();
        if s.requests_held == 0 && s.live_slots == s.prealloc_slots as u64 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("slots still held: {:?}", node.stats());
}
