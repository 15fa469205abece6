//! Requests of one tensor of bytes, as the runtime tests stage them.
#![allow(dead_code)]

use tensorferry::runtime::InstanceNode;
use tensorferry_core::slots::{Dtype, TensorSpec};

/// Stages request `id` at `node`, one tensor `field` of `len` bytes, each
/// byte as `byte` makes it from its index, and commits it.
pub fn stage_bytes(
    node: &InstanceNode,
    id: &str,
    field: &str,
    len: u64,
    byte: impl Fn(usize) -> u8,
) {
    let shape = [len];
    let spec = [TensorSpec {
        field,
        list_index: None,
        shape: &shape,
        dtype: Dtype::UInt8,
        byte_len: len,
    }];
    let mut staging = node.stage(id, &spec).unwrap();
    for (i, b) in staging.tensor_mut(0).unwrap().iter_mut().enumerate() {
        *b = byte(i);
    }
    staging.commit("{}").unwrap();
}
