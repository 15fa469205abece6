//! A node whose progress thread panics stops, and says so: its calls
//! return `NodeError::Stopped` instead of waiting forever or touching a
//! pool its stopped machine may still describe, and dropping it ends
//! cleanly. The panic is made by a data plane that panics when asked to
//! write, wrapped around the real shared-memory plane.

mod common;
#[path = "common/hooked.rs"]
mod hooked;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::endpoint;
use hooked::{Hooked, Hooks};
use tensorferry::runtime::{DataPlane, InstanceNodeConfig, NodeError};
use tensorferry_core::slots::{Dtype, TensorSpec};
use tensorferry_shm::UdsChannel;

/// Hooks that panic in `post_write` once armed.
struct PanicsOnWrite(Arc<AtomicBool>);

impl<T> Hooks<T> for PanicsOnWrite {
    fn writing(&mut self, _inner: &T) {
        assert!(!self.0.load(Ordering::Relaxed), "a data plane that panics");
    }
}

#[test]
fn a_node_whose_progress_thread_panics_stops_and_says_so() {
    let second = Duration::from_secs(5);
    let coord = common::coordinator(&["encoder", "denoiser"]);
    let armed = Arc::new(AtomicBool::new(false));
    let trigger = Arc::clone(&armed);
    let enc = DataPlane::default()
        .start_instance_with(
            &InstanceNodeConfig::new("encoder", coord.endpoint()),
            16 << 20,
            UdsChannel::bind(&endpoint("enc")).unwrap(),
            move |inner| Hooked {
                hooks: PanicsOnWrite(trigger),
                inner,
            },
        )
        .unwrap();
    let den = common::instance("denoiser", coord.endpoint(), 16 << 20, "den");
    enc.wait_registered(second).unwrap();
    den.wait_registered(second).unwrap();
    let shape = [4096u64];
    let specs = [TensorSpec {
        field: "latents",
        list_index: None,
        shape: &shape,
        dtype: Dtype::UInt8,
        byte_len: 4096,
    }];
    // A hand-off first: the node works.
    let mut s = enc.stage("r-0", &specs).unwrap();
    s.tensor_mut(0).unwrap().fill(7);
    s.commit("{}").unwrap();
    let d = den.recv(second).expect("delivered");
    assert!(d.tensors().next().unwrap().bytes.iter().all(|&b| b == 7));
    d.release();
    assert!(enc.next_outcome(second).unwrap().sent);

    // The next write panics inside the progress thread.
    armed.store(true, Ordering::Relaxed);
    let mut s = enc.stage("r-1", &specs).unwrap();
    s.tensor_mut(0).unwrap().fill(8);
    s.commit("{}").unwrap();
    let mut stopped = false;
    for _ in 0..500 {
        match enc.stage("r-2", &specs) {
            Err(NodeError::Stopped) => {
                stopped = true;
                break;
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(staging) => {
                drop(staging);
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    assert!(
        stopped,
        "the node went on taking work after its thread stopped"
    );
    assert!(
        den.recv(Duration::from_millis(200)).is_none(),
        "the request whose write panicked was never delivered"
    );
    // Dropping the stopped node ends (the transport it kept is dropped
    // with it), and the others go on.
    drop(enc);
    drop(den);
    drop(coord);
}
