//! Helpers of the runtime tests.

/// A fresh `ipc://` endpoint in the temporary directory, unique in this
/// test process.
pub fn endpoint(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!(
        "ipc://{}/ferry-test-{}-{n}-{tag}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    )
}

/// An instance of `role` on the default data plane, with a pool of
/// `pool_len` bytes, registering with the coordinator at `coordinator`
/// from a fresh Unix socket tagged `tag`.
#[allow(dead_code)] // Not every test binary starts one this way.
pub fn instance(
    role: &str,
    coordinator: &str,
    pool_len: usize,
    tag: &str,
) -> tensorferry::runtime::InstanceNode {
    let settings = tensorferry::runtime::InstanceNodeConfig::new(role, coordinator);
    tensorferry::runtime::DataPlane::default()
        .start_instance_at(&settings, pool_len, &endpoint(tag))
        .unwrap()
}

/// A coordinator of `pipeline` on a fresh Unix socket.
#[allow(dead_code)] // Not every test binary starts one.
pub fn coordinator(pipeline: &[&str]) -> tensorferry::runtime::CoordinatorNode {
    coordinator_with(tensorferry::runtime::CoordinatorNodeConfig::new(pipeline))
}

/// A coordinator of `settings` on a fresh Unix socket.
#[allow(dead_code)] // Not every test binary starts one.
pub fn coordinator_with(
    settings: tensorferry::runtime::CoordinatorNodeConfig,
) -> tensorferry::runtime::CoordinatorNode {
    let ch = tensorferry_shm::UdsChannel::bind(&endpoint("coord")).unwrap();
    tensorferry::runtime::CoordinatorNode::start(&settings, ch, |_| {}).unwrap()
}
