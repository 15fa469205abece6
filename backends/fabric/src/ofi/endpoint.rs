//! The RDM endpoint: opening and binding it, its address, and posting
//! one RMA write or read.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use tensorferry_fabric_sys as sys;

use super::{check, fid_of, Av, Cq, Domain, Endpoint, Info};
use crate::error::{Call, FabricError, OpKind};

impl Endpoint {
    /// Opens an RDM endpoint of `info`, binds `cq` for both directions and
    /// `av`, and enables it.
    pub fn open(
        domain: &Arc<Domain>,
        info: &Info,
        cq: &Arc<Cq>,
        av: &Arc<Av>,
    ) -> Result<Arc<Self>, FabricError> {
        let mut ptr = ptr::null_mut();
        // SAFETY: live domain and info.
        let ret = unsafe {
            sys::ferry_fi_endpoint(domain.ptr, info.ptr.as_ptr(), &mut ptr, ptr::null_mut())
        };
        check(Call::Endpoint, ret as isize, None)?;
        let mut ep = Self {
            ptr,
            name: Vec::new(),
            _cq: Arc::clone(cq),
            _av: Arc::clone(av),
            _domain: Arc::clone(domain),
        };
        // SAFETY: live endpoint, AV and CQ of the same domain.
        let ret = unsafe { sys::ferry_fi_ep_bind(ep.ptr, fid_of(av.ptr), 0) };
        check(Call::EpBindAv, ret as isize, None)?;
        // SAFETY: as above.
        let ret = unsafe {
            sys::ferry_fi_ep_bind(
                ep.ptr,
                fid_of(cq.ptr),
                u64::from(sys::FI_TRANSMIT | sys::FI_RECV),
            )
        };
        check(Call::EpBindCq, ret as isize, None)?;
        // SAFETY: live, bound endpoint.
        let ret = unsafe { sys::ferry_fi_enable(ep.ptr) };
        check(Call::Enable, ret as isize, None)?;
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: `name` is writable for `len` bytes; len is updated.
        let ret =
            unsafe { sys::ferry_fi_getname(fid_of(ep.ptr), name.as_mut_ptr().cast(), &mut len) };
        check(Call::GetName, ret as isize, None)?;
        name.truncate(len);
        ep.name = name;
        Ok(Arc::new(ep))
    }

    /// The endpoint's address, as peers insert it.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Posts one RMA write of `len` bytes from `local` (described by
    /// `desc`) to `remote_addr` under `key` at `dest`. `context` must stay
    /// valid and untouched until its completion is read.
    ///
    /// # Safety
    /// `local..local+len` must stay readable until the completion, and
    /// `context` must point to writable memory of at least
    /// `fi_context2`'s size that lives until the completion.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write(
        &self,
        local: *const u8,
        len: usize,
        desc: *mut c_void,
        dest: sys::fi_addr_t,
        remote_addr: u64,
        key: u64,
        data: u64,
        flags: u64,
        context: *mut c_void,
    ) -> isize {
        let rma = Rma {
            local: local as *mut u8,
            len,
            desc,
            peer: dest,
            remote_addr,
            key,
            data,
            flags,
            context,
        };
        // SAFETY: the caller's contract.
        unsafe { self.post(&rma, sys::ferry_fi_writemsg) }
    }

    /// Posts one RMA read of `len` bytes at `remote_addr` under `key` at
    /// `src` into `local` (described by `desc`). `context` must stay valid
    /// and untouched until its completion is read; the completion means
    /// the bytes are in `local`.
    ///
    /// # Safety
    /// `local..local+len` must stay writable, and not be read or written
    /// by anyone else, until the completion, and `context` must point to
    /// writable memory of at least `fi_context2`'s size that lives until
    /// the completion.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn read(
        &self,
        local: *mut u8,
        len: usize,
        desc: *mut c_void,
        src: sys::fi_addr_t,
        remote_addr: u64,
        key: u64,
        flags: u64,
        context: *mut c_void,
    ) -> isize {
        let rma = Rma {
            local,
            len,
            desc,
            peer: src,
            remote_addr,
            key,
            data: 0,
            flags,
            context,
        };
        // SAFETY: the caller's contract.
        unsafe { self.post(&rma, sys::ferry_fi_readmsg) }
    }

    /// Posts `rma` as `kind` says: a write ([`write`](Self::write)) or a
    /// read ([`read`](Self::read)).
    ///
    /// # Safety
    /// As [`write`](Self::write) for a write, [`read`](Self::read) for a
    /// read.
    pub unsafe fn post_rma(&self, kind: OpKind, rma: &Rma) -> isize {
        match kind {
            // SAFETY: the caller's contract for a write.
            OpKind::Write => unsafe { self.post(rma, sys::ferry_fi_writemsg) },
            // A read carries no immediate data, whatever `rma.data` says.
            // SAFETY: the caller's contract for a read.
            OpKind::Read => unsafe { self.post(&Rma { data: 0, ..*rma }, sys::ferry_fi_readmsg) },
        }
    }

    /// Builds `rma`'s message and hands it to `call` (`fi_writemsg` or
    /// `fi_readmsg`, which take the same message).
    ///
    /// # Safety
    /// As [`write`](Self::write) or [`read`](Self::read), whichever `call`
    /// is.
    unsafe fn post(
        &self,
        rma: &Rma,
        call: unsafe extern "C" fn(*mut sys::fid_ep, *const sys::fi_msg_rma, u64) -> isize,
    ) -> isize {
        let iov = libc::iovec {
            iov_base: rma.local.cast(),
            iov_len: rma.len,
        };
        let rma_iov = sys::fi_rma_iov {
            addr: rma.remote_addr,
            len: rma.len,
            key: rma.key,
        };
        let mut desc = rma.desc;
        let msg = sys::fi_msg_rma {
            msg_iov: (&iov as *const libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            addr: rma.peer,
            rma_iov: &rma_iov,
            rma_iov_count: 1,
            context: rma.context,
            data: rma.data,
        };
        // SAFETY: the caller's contract covers the local memory and the
        // context; the descriptors are read during the call only.
        unsafe { call(self.ptr, &msg, rma.flags) }
    }
}

/// One RMA operation's arguments, as `fi_writemsg` and `fi_readmsg` take
/// them.
#[derive(Clone, Copy, Debug)]
pub struct Rma {
    /// This side's bytes: a write's source, a read's destination.
    pub local: *mut u8,
    /// How many bytes.
    pub len: usize,
    /// The descriptor of the region `local` lies in.
    pub desc: *mut c_void,
    /// The peer written to or read from.
    pub peer: sys::fi_addr_t,
    /// The peer's bytes, as its region is addressed.
    pub remote_addr: u64,
    /// The key of the peer's region.
    pub key: u64,
    /// A write's remote CQ data (a read carries none: `post_rma` sends
    /// 0 whatever this says).
    pub data: u64,
    /// The `FI_*` operation flags.
    pub flags: u64,
    /// The operation context its completion gives back.
    pub context: *mut c_void,
}
