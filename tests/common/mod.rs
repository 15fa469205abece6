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
