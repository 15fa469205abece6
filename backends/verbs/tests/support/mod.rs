//! What the crate's own tests (`src/tests`, over the stand-in) and its
//! device tests (`tests/device.rs`) share: included by both.

use tensorferry_core::transport::{Region, WriteOp, WriteTag};

/// A write of `len` bytes at `off` of `region` to `dest_addr` at the peer
/// `session` (one that may be gone, or never was), tagged as its
/// `cookie`.
pub fn write_op(
    region: Region,
    off: u64,
    len: u64,
    session: &str,
    dest_addr: u64,
    cookie: u64,
) -> WriteOp<'_> {
    WriteOp {
        region,
        local_offset: off,
        len,
        dest_session: session,
        dest_addr,
        tag: WriteTag(cookie),
        cookie,
    }
}
