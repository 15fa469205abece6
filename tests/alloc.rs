//! No heap allocation per hand-off in steady state, on the data and control
//! path of the runtime: a coordinator, a sender and a receiver over Unix
//! sockets and shared-memory pools, with a counting global allocator.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::endpoint;
use tensorferry::runtime::{DataPlane, InstanceNodeConfig, Prealloc};
use tensorferry_core::slots::{Dtype, TensorSpec};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a
// counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_hand_off_allocates_nothing_in_steady_state() {
    let second = Duration::from_secs(5);
    let coord = common::coordinator(&["encoder", "denoiser"]);
    let enc = common::instance("encoder", coord.endpoint(), 64 << 20, "enc");
    let mut den_settings = InstanceNodeConfig::new("denoiser", coord.endpoint());
    den_settings.config.prealloc = Prealloc {
        count: 2,
        size: 8 << 20,
    };
    let den = DataPlane::default()
        .start_instance_at(&den_settings, 64 << 20, &endpoint("den"))
        .unwrap();
    enc.wait_registered(second).unwrap();
    den.wait_registered(second).unwrap();

    let shape = [2u64, 1 << 20];
    let specs = [TensorSpec {
        field: "latents",
        list_index: None,
        shape: &shape,
        dtype: Dtype::BFloat16,
        byte_len: 4 << 20,
    }];
    // Both paths: small requests take preallocated slots; with both taken
    // (two in flight), the third takes the slow path through allocation.
    let mut id_buf = [0u8; 32];
    let mut round = |i: u32| {
        let mut ids = [[0u8; 32]; 3];
        let mut lens = [0usize; 3];
        for k in 0..3 {
            let mut cur = std::io::Cursor::new(&mut id_buf[..]);
            write!(cur, "r-{i}-{k}").unwrap();
            let n = cur.position() as usize;
            ids[k][..n].copy_from_slice(&id_buf[..n]);
            lens[k] = n;
            let id = std::str::from_utf8(&ids[k][..n]).unwrap();
            let mut s = enc.stage(id, &specs).unwrap();
            s.tensor_mut(0).unwrap()[0] = i as u8;
            s.commit(r#"{"prompt":"a fox","steps":50}"#).unwrap();
        }
        for _ in 0..3 {
            let d = den.recv(second).expect("delivered");
            assert_eq!(d.tensors().next().unwrap().bytes[0], i as u8);
            d.release();
        }
        for _ in 0..3 {
            assert!(enc.next_outcome(second).unwrap().sent);
        }
    };
    // Warm-up: connections, peer mappings, buffers grown to size.
    for i in 0..100 {
        round(i);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    // The counter sees allocations (starting the nodes made many).
    assert!(before > 100);
    for i in 100..1100 {
        round(i);
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(allocated, 0, "{allocated} allocations over 3,000 hand-offs");
    // The coordinator's figures lag its last `transfer_done` by a turn.
    let mut s = coord.snapshot().stats;
    for _ in 0..500 {
        if s.delivered == 3300 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        s = coord.snapshot().stats;
    }
    assert_eq!(s.delivered, 3300);
    assert!(s.fast_path > 0 && s.fast_path < 3300, "{s:?}");
}
