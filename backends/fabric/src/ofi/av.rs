//! The address vector: the table of peers' endpoint addresses.

use std::ptr;
use std::sync::Arc;

use tensorferry_fabric_sys as sys;

use super::{check, Av, Domain, ADDR_UNSPEC};
use crate::error::{Call, FabricError};

impl Av {
    /// Opens a table AV.
    pub fn open(domain: &Arc<Domain>) -> Result<Arc<Self>, FabricError> {
        let mut attr = sys::fi_av_attr {
            type_: sys::fi_av_type_FI_AV_TABLE,
            ..Default::default()
        };
        let mut ptr = ptr::null_mut();
        // SAFETY: live domain; attr initialised.
        let ret =
            unsafe { sys::ferry_fi_av_open(domain.ptr, &mut attr, &mut ptr, ptr::null_mut()) };
        check(Call::AvOpen, ret as isize, None)?;
        Ok(Arc::new(Self {
            ptr,
            _domain: Arc::clone(domain),
        }))
    }

    /// Inserts one peer address (as its `fi_getname` gave it).
    pub fn insert(&self, addr: &[u8], peer: &str) -> Result<sys::fi_addr_t, FabricError> {
        let mut out = ADDR_UNSPEC;
        // SAFETY: `addr` is readable for its length; the provider reads
        // one address of its own format from it (a shorter buffer than its
        // format is refused by the length check of the caller).
        let ret = unsafe {
            sys::ferry_fi_av_insert(
                self.ptr,
                addr.as_ptr().cast(),
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        let n = check(Call::AvInsert, ret as isize, Some(peer))?;
        if n != 1 || out == ADDR_UNSPEC {
            return Err(FabricError::Call {
                call: Call::AvInsert,
                errno: sys::FI_EINVAL as i32,
                text: "address not inserted".into(),
                peer: Some(peer.to_owned()),
            });
        }
        Ok(out)
    }

    /// Removes a peer address.
    pub fn remove(&self, mut addr: sys::fi_addr_t) {
        // SAFETY: live AV; one address.
        let _ = unsafe { sys::ferry_fi_av_remove(self.ptr, &mut addr, 1, 0) };
    }
}
