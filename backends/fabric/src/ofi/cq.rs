//! The completion queue: reading entries and error entries, sleeping for
//! them where the provider has a wait object, and waking the sleeper.

use std::ffi::CStr;
use std::ptr;
use std::sync::Arc;

use tensorferry_fabric_sys as sys;

use super::{check, strerror, Cq, Domain};
use crate::error::{Call, FabricError};

impl Cq {
    /// Opens a CQ of `size` entries with `fi_cq_data_entry` entries, with a
    /// wait object where the provider offers one (so that the progress
    /// thread can sleep in `fi_cq_sread`), polled otherwise.
    pub fn open(domain: &Arc<Domain>, size: usize) -> Result<Arc<Self>, FabricError> {
        let mut last = None;
        for (wait_obj, waitable) in [
            (sys::fi_wait_obj_FI_WAIT_UNSPEC, true),
            (sys::fi_wait_obj_FI_WAIT_NONE, false),
        ] {
            let mut attr = sys::fi_cq_attr {
                size,
                format: sys::fi_cq_format_FI_CQ_FORMAT_DATA,
                wait_obj,
                ..Default::default()
            };
            let mut ptr = ptr::null_mut();
            // SAFETY: live domain; attr is a valid, initialised struct.
            let ret =
                unsafe { sys::ferry_fi_cq_open(domain.ptr, &mut attr, &mut ptr, ptr::null_mut()) };
            match check(Call::CqOpen, ret as isize, None) {
                Ok(_) => {
                    return Ok(Arc::new(Self {
                        ptr,
                        waitable,
                        _domain: Arc::clone(domain),
                    }))
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(FabricError::Call {
            call: Call::CqOpen,
            errno: sys::FI_EINVAL as i32,
            text: strerror(sys::FI_EINVAL as i32),
            peer: None,
        }))
    }

    /// True if [`sread`](Self::sread) can sleep.
    pub fn waitable(&self) -> bool {
        self.waitable
    }

    /// Reads up to `buf.len()` entries without waiting: the count,
    /// `Ok(0)` if none, or the error (`FI_EAVAIL`: an error entry waits for
    /// [`read_err`](Self::read_err)).
    pub fn read(&self, buf: &mut [sys::fi_cq_data_entry]) -> Result<usize, i32> {
        // SAFETY: `buf` holds `buf.len()` entries of the CQ's format.
        let n = unsafe { sys::ferry_fi_cq_read(self.ptr, buf.as_mut_ptr().cast(), buf.len()) };
        Self::count(n)
    }

    /// Like [`read`](Self::read), sleeping up to `timeout_ms` for an entry.
    pub fn sread(&self, buf: &mut [sys::fi_cq_data_entry], timeout_ms: i32) -> Result<usize, i32> {
        // SAFETY: as in read; no wait condition.
        let n = unsafe {
            sys::ferry_fi_cq_sread(
                self.ptr,
                buf.as_mut_ptr().cast(),
                buf.len(),
                ptr::null(),
                timeout_ms,
            )
        };
        Self::count(n)
    }

    fn count(n: isize) -> Result<usize, i32> {
        if n >= 0 {
            Ok(n as usize)
        } else if n == -(sys::FI_EAGAIN as isize) || n == -(sys::FI_ETIMEDOUT as isize) {
            Ok(0)
        } else {
            Err(i32::try_from(-n).unwrap_or(i32::MAX))
        }
    }

    /// Reads the next error entry, with libfabric's text for its error
    /// number only: the provider's own text is asked of the endpoint the
    /// entry came from, which must not be done once that is closed (rxm
    /// asks its closed connection's queue, and crashes).
    pub fn read_err_of_closed(&self) -> Option<(sys::fi_cq_err_entry, String)> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: `e` is a valid error entry to fill; flags 0.
        let n = unsafe { sys::ferry_fi_cq_readerr(self.ptr, &mut e, 0) };
        if n <= 0 {
            return None;
        }
        Some((e, strerror(e.err)))
    }

    /// Reads the next error entry, with the provider's text for it.
    pub fn read_err(&self) -> Option<(sys::fi_cq_err_entry, String)> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: `e` is a valid error entry to fill; flags 0.
        let n = unsafe { sys::ferry_fi_cq_readerr(self.ptr, &mut e, 0) };
        if n <= 0 {
            return None;
        }
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: live CQ; err_data from the entry just read; `buf` is
        // writable for its length.
        let text = unsafe {
            sys::ferry_fi_cq_strerror(
                self.ptr,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let text = if text.is_null() {
            strerror(e.err)
        } else {
            // SAFETY: fi_cq_strerror returns a NUL-terminated string.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        Some((e, text))
    }

    /// Wakes a thread sleeping in [`sread`](Self::sread).
    pub fn signal(&self) {
        if self.waitable {
            // SAFETY: live CQ.
            let _ = unsafe { sys::ferry_fi_cq_signal(self.ptr) };
        }
    }
}
