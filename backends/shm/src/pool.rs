//! A pool in a POSIX shared-memory object.
//!
//! The owner creates the object (`shm_open(O_CREAT | O_EXCL)`), sizes and
//! maps it, and unlinks it on drop. Peers open it by name and map it too;
//! their mapping stays valid after the owner unlinks it (the memory lives
//! until the last mapping goes), which is why a peer checks the object's
//! link count before it writes.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::ShmError;

/// Objects created by this process so far (for unique names).
static CREATED: AtomicU32 = AtomicU32::new(0);

/// The prefix of every object name ferry creates (`<prefix>-<pid>-<n>`):
/// `ferry`, unless `FERRY_SHM_PREFIX` names another (letters, digits and
/// `-`). Tests set it to find what they left behind; a test that chooses
/// a prefix for its processes nests it under this one, so that what
/// started the test finds those too.
pub fn prefix() -> String {
    std::env::var("FERRY_SHM_PREFIX")
        .ok()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .unwrap_or_else(|| "ferry".to_owned())
}

/// A mapped shared-memory object: this process's own pool, or a peer's.
#[derive(Debug)]
pub struct ShmPool {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    owner: bool,
}

// SAFETY: the mapping is plain shared memory, valid until drop; ShmPool
// hands out raw pointers only, whose use is each caller's own unsafe seam.
unsafe impl Send for ShmPool {}
// SAFETY: as above; no method mutates through &self.
unsafe impl Sync for ShmPool {}

fn sys(call: &'static str, name: &str) -> ShmError {
    ShmError::Sys {
        call,
        name: name.to_owned(),
        source: io::Error::last_os_error(),
    }
}

impl ShmPool {
    /// Creates and maps a new object of `len` bytes, named
    /// `/<prefix>-<pid>-<n>`, with every page populated (so that the first
    /// write into it does not pay for page faults).
    pub fn create(len: usize) -> Result<Self, ShmError> {
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let name = format!("/{}-{}-{}", prefix(), std::process::id(), n);
        let c = CString::new(name.as_str()).map_err(|_| ShmError::BadSession {
            session: name.clone(),
            why: "name holds a NUL byte",
        })?;
        // SAFETY: c is a valid NUL-terminated string; the flags create a new
        // object readable and writable by this user only.
        let raw = unsafe {
            libc::shm_open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if raw < 0 {
            return Err(sys("shm_open", &name));
        }
        // SAFETY: raw is a descriptor shm_open just returned; we own it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let unlink = |e| {
            // SAFETY: c is a valid NUL-terminated name of the object we made.
            unsafe { libc::shm_unlink(c.as_ptr()) };
            e
        };
        let size = libc::off_t::try_from(len).map_err(|_| {
            unlink(ShmError::Sys {
                call: "ftruncate",
                name: name.clone(),
                source: io::Error::from(io::ErrorKind::InvalidInput),
            })
        })?;
        // SAFETY: fd is a valid shared-memory descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(unlink(sys("ftruncate", &name)));
        }
        let ptr = map(&fd, len, &name).map_err(unlink)?;
        Ok(Self {
            name,
            ptr,
            len,
            fd,
            owner: true,
        })
    }

    /// Opens and maps a peer's object, which must hold at least `len` bytes.
    pub fn open(name: &str, len: usize) -> Result<Self, ShmError> {
        let c = CString::new(name).map_err(|_| ShmError::BadSession {
            session: name.to_owned(),
            why: "name holds a NUL byte",
        })?;
        // SAFETY: c is a valid NUL-terminated string; no object is created.
        let raw = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if raw < 0 {
            return Err(sys("shm_open", name));
        }
        // SAFETY: raw is a descriptor shm_open just returned; we own it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let actual = fstat(&fd, name)?.st_size as u64;
        if actual < len as u64 {
            return Err(ShmError::ShortObject {
                session: name.to_owned(),
                claimed: len as u64,
                actual,
            });
        }
        let ptr = map(&fd, len, name)?;
        Ok(Self {
            name: name.to_owned(),
            ptr,
            len,
            fd,
            owner: false,
        })
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapping's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an object has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True once the object was unlinked (its owner dropped it or died and
    /// it was cleaned): writes into this mapping would reach no one.
    pub fn is_unlinked(&self) -> Result<bool, ShmError> {
        Ok(fstat(&self.fd, &self.name)?.st_nlink == 0)
    }

    /// The object's state now: unlinked, and its size (which its owner may
    /// have changed since it was mapped).
    pub fn object_state(&self) -> Result<(bool, u64), ShmError> {
        let st = fstat(&self.fd, &self.name)?;
        Ok((st.st_nlink == 0, u64::try_from(st.st_size).unwrap_or(0)))
    }
}

fn fstat(fd: &OwnedFd, name: &str) -> Result<libc::stat, ShmError> {
    // SAFETY: stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid and st is a writable stat.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(sys("fstat", name));
    }
    Ok(st)
}

fn map(fd: &OwnedFd, len: usize, name: &str) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh shared mapping of a valid descriptor; the kernel
    // picks the address. MAP_POPULATE prefaults the pages.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(sys("mmap", name));
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| sys("mmap", name))
}

impl Drop for ShmPool {
    fn drop(&mut self) {
        // SAFETY: ptr/len is the mapping made in `map`, unmapped once here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if self.owner {
            if let Ok(c) = CString::new(self.name.as_str()) {
                // SAFETY: c is a valid NUL-terminated name of our object.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_sees_the_owners_bytes_and_the_unlink() {
        let pool = ShmPool::create(1 << 20).unwrap();
        let peer = ShmPool::open(pool.name(), 1 << 20).unwrap();
        // SAFETY: both mappings are 1 MiB long and alive.
        unsafe {
            *peer.as_ptr().add(4096) = 7;
            assert_eq!(*pool.as_ptr().add(4096), 7);
        }
        assert!(!peer.is_unlinked().unwrap());
        let name = pool.name().to_owned();
        drop(pool);
        assert!(peer.is_unlinked().unwrap());
        assert!(matches!(
            ShmPool::open(&name, 1 << 20),
            Err(ShmError::Sys {
                call: "shm_open",
                ..
            })
        ));
    }

    #[test]
    fn a_short_object_is_refused() {
        let pool = ShmPool::create(4096).unwrap();
        assert!(matches!(
            ShmPool::open(pool.name(), 8192),
            Err(ShmError::ShortObject { actual: 4096, .. })
        ));
    }
}
