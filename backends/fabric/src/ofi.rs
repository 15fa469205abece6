//! The safe layer over `ferry-fabric-sys`: owned `fi_info` lists and RAII
//! handles for fabric, domain, completion queue, address vector, RDM
//! endpoint and memory region. Each handle keeps its parents alive (an
//! `Arc`), so libfabric objects are always closed children first.
//!
//! Every libfabric call of the backend is made in this module.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use ferry_fabric_sys as sys;

use crate::error::{Call, FabricError};
use crate::provider::Hints;

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
    ptr: NonNull<sys::fi_info>,
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

    fn info(&self) -> &sys::fi_info {
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

    /// Modes the provider requires of ferry.
    pub fn mode(&self) -> u64 {
        self.info().mode
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

// SAFETY (all handle types): the domain is opened with FI_THREAD_SAFE
// (checked in `Fabric::open`'s caller before any object is made), under
// which libfabric serialises concurrent calls on every object itself.
unsafe impl Send for Fabric {}
// SAFETY: see above.
unsafe impl Sync for Fabric {}
// SAFETY: see above.
unsafe impl Send for Domain {}
// SAFETY: see above.
unsafe impl Sync for Domain {}
// SAFETY: see above.
unsafe impl Send for Cq {}
// SAFETY: see above.
unsafe impl Sync for Cq {}
// SAFETY: see above.
unsafe impl Send for Av {}
// SAFETY: see above.
unsafe impl Sync for Av {}
// SAFETY: see above.
unsafe impl Send for Endpoint {}
// SAFETY: see above.
unsafe impl Sync for Endpoint {}
// SAFETY: see above; `desc` is an opaque provider handle only passed back
// to libfabric.
unsafe impl Send for MemoryRegion {}
// SAFETY: see above.
unsafe impl Sync for MemoryRegion {}

impl Drop for Fabric {
    fn drop(&mut self) {
        close("fi_close(fabric)", fid_of(self.ptr));
    }
}
impl Drop for Domain {
    fn drop(&mut self) {
        close("fi_close(domain)", fid_of(self.ptr));
    }
}
impl Drop for Cq {
    fn drop(&mut self) {
        close("fi_close(cq)", fid_of(self.ptr));
    }
}
impl Drop for Av {
    fn drop(&mut self) {
        close("fi_close(av)", fid_of(self.ptr));
    }
}
impl Drop for Endpoint {
    fn drop(&mut self) {
        close("fi_close(ep)", fid_of(self.ptr));
    }
}
impl Drop for MemoryRegion {
    fn drop(&mut self) {
        close("fi_close(mr)", fid_of(self.ptr));
    }
}

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
        let iov = libc::iovec {
            iov_base: local as *mut c_void,
            iov_len: len,
        };
        let rma = sys::fi_rma_iov {
            addr: remote_addr,
            len,
            key,
        };
        let mut desc = desc;
        let msg = sys::fi_msg_rma {
            msg_iov: (&iov as *const libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            addr: dest,
            rma_iov: &rma,
            rma_iov_count: 1,
            context,
            data,
        };
        // SAFETY: the caller's contract covers `local` and `context`; the
        // descriptors are read during the call only.
        unsafe { sys::ferry_fi_writemsg(self.ptr, &msg, flags) }
    }
}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` for local writes from it and remote
    /// writes into it, requesting `key` (0 where the provider assigns
    /// keys), and binds and enables it on `endpoint` where the provider
    /// requires (`FI_MR_ENDPOINT`).
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn register(
        domain: &Arc<Domain>,
        endpoint: Option<&Arc<Endpoint>>,
        addr: *mut u8,
        len: usize,
        key: u64,
    ) -> Result<Self, FabricError> {
        let mut ptr = ptr::null_mut();
        let access = u64::from(sys::FI_WRITE | sys::FI_REMOTE_WRITE);
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
