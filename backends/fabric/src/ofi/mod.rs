//! The safe layer over `tensorferry-fabric-sys`: owned `fi_info` lists and RAII
//! handles for fabric, domain, completion queue, address vector, RDM
//! endpoint and memory region. Each handle keeps its parents alive (an
//! `Arc`), so libfabric objects are always closed children first.
//!
//! Every libfabric call of the backend is made in this module.
//!
//! Modules: the `fi_info` list (`info`), the completion queue (`cq`), the
//! address vector (`av`), the endpoint (`endpoint`) and memory
//! registration (`memory_region`); the handles themselves, their closing
//! and the fabric and domain are here.
#![allow(unsafe_code)]

mod av;
mod cq;
mod endpoint;
mod info;
mod memory_region;

use std::ffi::{c_void, CStr};
use std::ptr;
use std::sync::Arc;

use tensorferry_fabric_sys as sys;

use crate::error::{Call, FabricError};

pub use endpoint::Rma;
pub use info::Info;

/// The libfabric API version ferry is written against.
pub const API_VERSION: u32 = sys::fi_version(1, 17);

/// `FI_ADDR_UNSPEC`, a cast in C.
pub const ADDR_UNSPEC: sys::fi_addr_t = u64::MAX;

/// `fi_strerror`'s text for a positive error number.
pub fn strerror(errno: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static, NUL-terminated
    // string for any value (unknown values get a generic text).
    let text = unsafe { sys::fi_strerror(errno) };
    if text.is_null() {
        return format!("error {errno}");
    }
    // SAFETY: non-null, NUL-terminated and static, as above.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Maps a libfabric return value (negative `FI_E*` on error) to a typed
/// error naming `call` and, where given, the peer.
pub fn check(call: Call, ret: isize, peer: Option<&str>) -> Result<usize, FabricError> {
    if ret >= 0 {
        return Ok(ret as usize);
    }
    let errno = i32::try_from(-ret).unwrap_or(i32::MAX);
    Err(FabricError::Call {
        call,
        errno,
        text: strerror(errno),
        peer: peer.map(str::to_owned),
    })
}

fn fid_of<T>(ptr: *mut T) -> *mut sys::fid {
    // Every libfabric object struct begins with its `struct fid`.
    ptr.cast()
}

fn close(call: &'static str, fid: *mut sys::fid) {
    // SAFETY: `fid` is the live object of the handle being dropped; its
    // children hold Arcs to it, so none is still open.
    let ret = unsafe { sys::ferry_fi_close(fid) };
    if ret != 0 {
        tracing::warn!(call, error = %strerror(-ret), "fi_close failed");
    }
}
/// An open fabric.
pub struct Fabric {
    ptr: *mut sys::fid_fabric,
}

/// An open domain (one NIC or interface).
pub struct Domain {
    ptr: *mut sys::fid_domain,
    _fabric: Arc<Fabric>,
}

/// A completion queue.
pub struct Cq {
    ptr: *mut sys::fid_cq,
    waitable: bool,
    _domain: Arc<Domain>,
}

/// An address vector (table of peer addresses).
pub struct Av {
    ptr: *mut sys::fid_av,
    _domain: Arc<Domain>,
}

/// An enabled RDM endpoint bound to one CQ (both directions) and one AV.
pub struct Endpoint {
    ptr: *mut sys::fid_ep,
    name: Vec<u8>,
    _cq: Arc<Cq>,
    _av: Arc<Av>,
    _domain: Arc<Domain>,
}

/// A registered memory region.
pub struct MemoryRegion {
    ptr: *mut sys::fid_mr,
    desc: *mut c_void,
    key: u64,
    _endpoint: Option<Arc<Endpoint>>,
    _domain: Arc<Domain>,
}

/// What every handle type shares: it is sent and shared between threads,
/// and dropping it closes its libfabric object (`what` names the call in
/// a failure's log line). A macro because the impls are the same for six
/// types that share no trait to hang them on.
macro_rules! handle_impls {
    ($($handle:ident => $what:literal),* $(,)?) => {$(
        // SAFETY: the domain is opened with FI_THREAD_SAFE (checked in
        // `Fabric::open`'s caller before any object is made), under which
        // libfabric serialises concurrent calls on every object itself;
        // a region's `desc` is an opaque provider handle only passed back
        // to libfabric.
        unsafe impl Send for $handle {}
        // SAFETY: as for `Send`.
        unsafe impl Sync for $handle {}

        impl Drop for $handle {
            fn drop(&mut self) {
                close($what, fid_of(self.ptr));
            }
        }
    )*};
}

handle_impls!(
    Fabric => "fi_close(fabric)",
    Domain => "fi_close(domain)",
    Cq => "fi_close(cq)",
    Av => "fi_close(av)",
    Endpoint => "fi_close(ep)",
    MemoryRegion => "fi_close(mr)",
);

impl Fabric {
    /// Opens the fabric of `info`.
    pub fn open(info: &Info) -> Result<Arc<Self>, FabricError> {
        let mut ptr = ptr::null_mut();
        // SAFETY: fabric_attr comes from a live fi_getinfo result.
        let ret = unsafe { sys::fi_fabric(info.info().fabric_attr, &mut ptr, ptr::null_mut()) };
        check(Call::Fabric, ret as isize, None)?;
        Ok(Arc::new(Self { ptr }))
    }
}

impl Domain {
    /// Opens the domain of `info` in `fabric`.
    pub fn open(fabric: &Arc<Fabric>, info: &Info) -> Result<Arc<Self>, FabricError> {
        let mut ptr = ptr::null_mut();
        // SAFETY: live fabric and info; `ptr` receives the new object.
        let ret = unsafe {
            sys::ferry_fi_domain(fabric.ptr, info.ptr.as_ptr(), &mut ptr, ptr::null_mut())
        };
        check(Call::Domain, ret as isize, None)?;
        Ok(Arc::new(Self {
            ptr,
            _fabric: Arc::clone(fabric),
        }))
    }
}
