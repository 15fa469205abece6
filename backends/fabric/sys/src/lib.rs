//! Raw bindings to the system libfabric: bindgen's output over the installed
//! headers, and `ferry_fi_*` functions from a C shim wrapping the `static
//! inline` calls (`fi_domain`, `fi_writemsg`, `fi_cq_read`, ...), which
//! bindgen cannot bind. Everything here is `unsafe` and undocumented beyond
//! libfabric's own man pages; `tensorferry-fabric` is the safe layer.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// `FI_VERSION(major, minor)`, a macro in C.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}
