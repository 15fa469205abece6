//! A node whose progress thread panics stops, and says so: its calls
//! return `NodeError::Stopped` instead of waiting forever or touching a
//! pool its stopped machine may still describe, and dropping it ends
//! cleanly. The panic is made by a data plane that panics when asked to
//! write, wrapped around the real shared-memory plane.
// The wrapper forwards the pool promise of the transport it owns.
#![allow(unsafe_code)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::endpoint;
use tensorferry::core::transport::{
    Capabilities, Completion, FaultKind, ReadOp, Region, Transport, WriteOp,
};
use tensorferry::runtime::{DataPlane, InstanceNodeConfig, NodeError, PoolOwner};
use tensorferry_core::slots::{Dtype, TensorSpec};
use tensorferry_shm::UdsChannel;

/// A transport that panics in `post_write` once `armed`.
struct PanicsOnWrite<T> {
    inner: T,
    armed: Arc<AtomicBool>,
}

impl<T: Transport> Transport for PanicsOnWrite<T> {
    type Error = T::Error;

    fn fault_kind(error: &T::Error) -> FaultKind {
        T::fault_kind(error)
    }

    fn session_id(&self) -> &str {
        self.inner.session_id()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    unsafe fn register(&mut self, addr: *mut u8, len: usize) -> Result<Region, T::Error> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.register(addr, len) }
    }

    fn deregister(&mut self, region: Region) -> Result<(), T::Error> {
        self.inner.deregister(region)
    }

    fn post_write(&mut self, write: &WriteOp<'_>) -> Result<(), T::Error> {
        assert!(
            !self.armed.load(Ordering::Relaxed),
            "a data plane that panics"
        );
        self.inner.post_write(write)
    }

    fn post_read(&mut self, read: &ReadOp<'_>) -> Result<(), T::Error> {
        self.inner.post_read(read)
    }

    fn poll_completion(&mut self) -> Option<Completion<T::Error>> {
        self.inner.poll_completion()
    }

    fn cancel_transfers(&mut self, dest_session: &str) -> Result<(), T::Error> {
        self.inner.cancel_transfers(dest_session)
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.wake_fd()
    }
}

// SAFETY: the wrapper owns the transport it forwards to and never moves it
// out or unmaps anything, so `T`'s promise holds while the wrapper lives.
unsafe impl<T: PoolOwner> PoolOwner for PanicsOnWrite<T> {
    fn pool_ptr(&self) -> *mut u8 {
        self.inner.pool_ptr()
    }

    fn pool_len(&self) -> usize {
        self.inner.pool_len()
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
            move |inner| PanicsOnWrite {
                inner,
                armed: trigger,
            },
        )
        .unwrap();
    let den = DataPlane::default()
        .start_instance_at(
            &InstanceNodeConfig::new("denoiser", coord.endpoint()),
            16 << 20,
            &endpoint("den"),
        )
        .unwrap();
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
