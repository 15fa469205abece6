//! Memory registration: a region registered for local writes from it and
//! remote writes into it (and for reads both ways where the provider
//! offers them), bound to the endpoint where the provider asks.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use tensorferry_fabric_sys as sys;

use super::{check, fid_of, Domain, Endpoint, MemoryRegion};
use crate::error::{Call, FabricError};

impl MemoryRegion {
    /// Registers `len` bytes at `addr` for local writes from it and remote
    /// writes into it, and with `reads` also for local reads into it
    /// (`FI_READ`) and remote reads from it (`FI_REMOTE_READ`), requesting
    /// `key` (0 where the provider assigns keys), and binds and enables it
    /// on `endpoint` where the provider requires (`FI_MR_ENDPOINT`).
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        endpoint: Option<&Arc<Endpoint>>,
        addr: *mut u8,
        len: usize,
        key: u64,
        reads: bool,
    ) -> Result<Self, FabricError> {
        let mut ptr = ptr::null_mut();
        let mut access = u64::from(sys::FI_WRITE | sys::FI_REMOTE_WRITE);
        if reads {
            access |= u64::from(sys::FI_READ | sys::FI_REMOTE_READ);
        }
        // SAFETY: the caller keeps the range mapped; live domain.
        let ret = unsafe {
            sys::ferry_fi_mr_reg(
                domain.ptr,
                addr.cast_const().cast(),
                len,
                access,
                0,
                key,
                0,
                &mut ptr,
                ptr::null_mut(),
            )
        };
        check(Call::MrReg, ret as isize, None)?;
        let mut mr = Self {
            ptr,
            desc: ptr::null_mut(),
            key: 0,
            _endpoint: endpoint.cloned(),
            _domain: Arc::clone(domain),
        };
        if let Some(ep) = endpoint {
            // SAFETY: live region and endpoint of the same domain.
            let ret = unsafe { sys::ferry_fi_mr_bind(mr.ptr, fid_of(ep.ptr), 0) };
            check(Call::MrBind, ret as isize, None)?;
            // SAFETY: live, bound region.
            let ret = unsafe { sys::ferry_fi_mr_enable(mr.ptr) };
            check(Call::MrEnable, ret as isize, None)?;
        }
        // SAFETY: live region.
        mr.desc = unsafe { sys::ferry_fi_mr_desc(mr.ptr) };
        // SAFETY: live region.
        mr.key = unsafe { sys::ferry_fi_mr_key(mr.ptr) };
        Ok(mr)
    }

    /// The local descriptor to pass with operations on this memory.
    pub fn desc(&self) -> *mut c_void {
        self.desc
    }

    /// The remote key peers use.
    pub fn key(&self) -> u64 {
        self.key
    }
}
