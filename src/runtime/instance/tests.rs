//! The node's waits, with the state reached into where a test must make
//! what the protocol makes only by chance.

use std::sync::atomic::AtomicUsize;

use tensorferry_shm::{MemChannel, MemHub};

use super::*;
use crate::runtime::DataPlane;

/// A node on the in-process channel, with no coordinator behind it.
fn lone_node(hub: &MemHub) -> InstanceNode {
    DataPlane::default()
        .start_instance(
            &InstanceNodeConfig::new("decoder", "coordinator"),
            1 << 20,
            MemChannel::bind(hub, "decoder").expect("bind the in-process channel"),
        )
        .expect("start the node")
}

#[test]
fn stale_wakes_do_not_start_a_receive_over() {
    let hub = MemHub::new();
    let node = lone_node(&hub);
    let timeout = Duration::from_millis(400);
    // A wake every quarter of the timeout, for ten timeouts at least: a
    // receive that waited anew after each returned only once they stopped.
    const WAKES: usize = 40;
    let woken = AtomicUsize::new(0);
    let returned = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !returned.load(Ordering::Acquire) && woken.load(Ordering::Relaxed) < WAKES {
                std::thread::sleep(timeout / 4);
                // A transfer announced, and gone (its token names no request)
                // by the time the receiver looks.
                let stale = (Token::from_cookie(u64::MAX), Arrival::now());
                node.shared.lock().received.push_back(stale);
                node.shared.changed.notify_all();
                woken.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(node.recv(timeout).is_none());
        returned.store(true, Ordering::Release);
    });
    let woken = woken.into_inner();
    assert!(
        woken < WAKES,
        "the receive outlasted {woken} stale wakes, a quarter of its timeout apart"
    );
}
