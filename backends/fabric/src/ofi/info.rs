//! The `fi_info` list: asking libfabric for endpoints, and reading what
//! it offered.

use std::ffi::{CStr, CString};
use std::ptr::{self, NonNull};

use tensorferry_fabric_sys as sys;

use super::{check, strerror, API_VERSION};
use crate::error::{Call, FabricError};
use crate::provider::Hints;

/// `fi_getinfo` answered with an empty list: no provider matches.
fn no_data() -> FabricError {
    FabricError::Call {
        call: Call::GetInfo,
        errno: sys::FI_ENODATA as i32,
        text: strerror(sys::FI_ENODATA as i32),
        peer: None,
    }
}

/// An `fi_info` list returned by `fi_getinfo`, freed on drop.
pub struct Info {
    pub(super) ptr: NonNull<sys::fi_info>,
}

// SAFETY: the list is plain data owned by this handle; nothing else
// refers to it, and it is only read after creation.
unsafe impl Send for Info {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once, here.
        unsafe { sys::fi_freeinfo(self.ptr.as_ptr()) };
    }
}

impl Info {
    /// Asks libfabric for endpoints matching `hints`, bound to `node` (an
    /// address of this host) when given.
    pub fn get(hints: &Hints, node: Option<&str>) -> Result<Self, FabricError> {
        let prov = CString::new(hints.provider.as_str()).map_err(|_| FabricError::Unsupported {
            provider: hints.provider.clone(),
            what: "provider name holds a NUL byte".into(),
        })?;
        let node = node
            .map(|n| {
                CString::new(n).map_err(|_| FabricError::Unsupported {
                    provider: hints.provider.clone(),
                    what: format!("source address {n:?} holds a NUL byte"),
                })
            })
            .transpose()?;
        // SAFETY: fi_allocinfo returns a zeroed fi_info with every
        // attribute struct allocated, or null.
        let h = unsafe { sys::ferry_fi_allocinfo() };
        let Some(h) = NonNull::new(h) else {
            return Err(FabricError::Call {
                call: Call::AllocInfo,
                errno: sys::FI_ENOMEM as i32,
                text: strerror(sys::FI_ENOMEM as i32),
                peer: None,
            });
        };
        let hints_info = Info { ptr: h };
        // SAFETY: `h` and its attribute structs are valid and owned by
        // `hints_info`; prov_name is malloc'd (strdup) because
        // fi_freeinfo frees it.
        let ret = unsafe {
            let i = &mut *h.as_ptr();
            i.caps = hints.caps;
            i.mode = hints.mode;
            (*i.ep_attr).type_ = hints.ep_type;
            (*i.domain_attr).mr_mode = hints.mr_mode;
            (*i.domain_attr).threading = hints.threading;
            (*i.domain_attr).av_type = hints.av_type;
            (*i.tx_attr).op_flags = hints.tx_op_flags;
            (*i.fabric_attr).prov_name = libc::strdup(prov.as_ptr());
            let mut out = ptr::null_mut();
            let ret = sys::fi_getinfo(
                API_VERSION,
                node.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                ptr::null(),
                if node.is_some() { sys::FI_SOURCE } else { 0 },
                h.as_ptr(),
                &mut out,
            );
            (ret, out)
        };
        drop(hints_info);
        check(Call::GetInfo, ret.0 as isize, None)?;
        NonNull::new(ret.1)
            .map(|ptr| Self { ptr })
            .ok_or_else(no_data)
    }

    /// A copy of this entry (the list's first) bound to `addr`, an
    /// endpoint's name in the entry's address format: what reopens an
    /// endpoint at the address it had, so that peers reach it by the same
    /// session id.
    pub fn at_source(&self, addr: &[u8]) -> Result<Self, FabricError> {
        let no_memory = || FabricError::Call {
            call: Call::AllocInfo,
            errno: sys::FI_ENOMEM as i32,
            text: strerror(sys::FI_ENOMEM as i32),
            peer: None,
        };
        // SAFETY: a live entry; fi_dupinfo copies that entry alone (its
        // `next` is null) into memory the copy owns, or returns null.
        let dup =
            NonNull::new(unsafe { sys::fi_dupinfo(self.ptr.as_ptr()) }).ok_or_else(no_memory)?;
        let copy = Self { ptr: dup };
        // SAFETY: `copy` owns its entry; its source address is malloc'd
        // (fi_freeinfo frees it), so the old one is freed and the new one
        // malloc'd, `addr.len()` bytes, before the entry is used.
        unsafe {
            let i = &mut *dup.as_ptr();
            let to = libc::malloc(addr.len().max(1));
            if to.is_null() {
                return Err(no_memory());
            }
            ptr::copy_nonoverlapping(addr.as_ptr(), to.cast::<u8>(), addr.len());
            libc::free(i.src_addr);
            i.src_addr = to;
            i.src_addrlen = addr.len();
        }
        Ok(copy)
    }

    /// Every endpoint type of every provider libfabric offers on this host
    /// (`fi_getinfo` without hints), as `fi_info -l` lists them.
    pub fn all() -> Result<Self, FabricError> {
        let mut out = ptr::null_mut();
        // SAFETY: null node, service and hints ask for everything; `out`
        // receives a list this handle frees.
        let ret = unsafe {
            sys::fi_getinfo(
                API_VERSION,
                ptr::null(),
                ptr::null(),
                0,
                ptr::null_mut(),
                &mut out,
            )
        };
        check(Call::GetInfo, ret as isize, None)?;
        NonNull::new(out)
            .map(|ptr| Self { ptr })
            .ok_or_else(no_data)
    }

    /// Provider, fabric and domain names of every entry of the list.
    pub fn entries(&self) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        let mut p: *const sys::fi_info = self.ptr.as_ptr();
        while !p.is_null() {
            // SAFETY: an entry of the list fi_getinfo returned, alive while
            // self is; its attribute pointers are filled (or null, which
            // `text` takes).
            let (prov, fabric, domain, next) = unsafe {
                let i = &*p;
                let (prov, fabric) = if i.fabric_attr.is_null() {
                    (ptr::null_mut(), ptr::null_mut())
                } else {
                    ((*i.fabric_attr).prov_name, (*i.fabric_attr).name)
                };
                let domain = if i.domain_attr.is_null() {
                    ptr::null_mut()
                } else {
                    (*i.domain_attr).name
                };
                (prov, fabric, domain, i.next)
            };
            out.push((Self::text(prov), Self::text(fabric), Self::text(domain)));
            p = next;
        }
        out
    }

    pub(super) fn info(&self) -> &sys::fi_info {
        // SAFETY: the first entry of a list fi_getinfo returned, alive
        // while self is.
        unsafe { self.ptr.as_ref() }
    }

    fn domain_attr(&self) -> &sys::fi_domain_attr {
        // SAFETY: fi_getinfo fills every attribute pointer of its entries.
        unsafe { &*self.info().domain_attr }
    }

    fn text(p: *const std::os::raw::c_char) -> String {
        if p.is_null() {
            return String::new();
        }
        // SAFETY: libfabric's names are NUL-terminated strings owned by
        // the info list, alive while it is.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The provider's name (`tcp;ofi_rxm`).
    pub fn provider(&self) -> String {
        // SAFETY: as in domain_attr.
        Self::text(unsafe { (*self.info().fabric_attr).prov_name })
    }

    /// The fabric's name (a subnet for tcp).
    pub fn fabric_name(&self) -> String {
        // SAFETY: as in domain_attr.
        Self::text(unsafe { (*self.info().fabric_attr).name })
    }

    /// The domain's name (an interface or NIC).
    pub fn domain_name(&self) -> String {
        Self::text(self.domain_attr().name)
    }

    /// The memory-registration modes the provider requires.
    pub fn mr_mode(&self) -> i32 {
        self.domain_attr().mr_mode
    }

    /// Bytes of a memory key the domain takes.
    pub fn mr_key_size(&self) -> usize {
        self.domain_attr().mr_key_size
    }

    /// Bytes of remote CQ data a write may carry.
    pub fn cq_data_size(&self) -> usize {
        self.domain_attr().cq_data_size
    }

    /// The threading level granted.
    pub fn threading(&self) -> sys::fi_threading {
        self.domain_attr().threading
    }

    /// The largest message (and RMA transfer) the endpoint takes.
    pub fn max_msg_size(&self) -> u64 {
        // SAFETY: as in domain_attr.
        unsafe { (*self.info().ep_attr).max_msg_size as u64 }
    }

    /// The capabilities the provider grants (`FI_*` bits).
    pub fn caps(&self) -> u64 {
        self.info().caps
    }

    /// Modes the provider requires of ferry.
    pub fn mode(&self) -> u64 {
        self.info().mode
    }
}
