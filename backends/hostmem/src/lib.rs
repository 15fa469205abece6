//! Host-side OS pieces the data planes share.
//!
//! - [`HostPool`]: pre-faulted anonymous host memory for a transport's
//!   pool. The libfabric and ibverbs data planes register one pool each;
//!   both map it here, so that registration pins resident pages and the
//!   first transfer does not fault.
//! - [`EventFd`]: the eventfd a transport signals when it has news for the
//!   runtime (its `wake_fd`).
//! - [`Copier`]: the threads that share large copies, for the
//!   shared-memory and same-host data planes.
//!
//! This crate depends on nothing of ferry's, so that every backend can use
//! it without a cycle.

mod copier;
mod eventfd;

pub use copier::Copier;
pub use eventfd::EventFd;

use std::io;
use std::ptr::NonNull;

/// A private anonymous mapping, populated at creation and unmapped on
/// drop.
#[derive(Debug)]
pub struct HostPool {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned memory; who may touch which bytes is the
// runtime's slot accounting, not this handle's.
unsafe impl Send for HostPool {}
// SAFETY: as above; the handle itself only hands out the base pointer.
unsafe impl Sync for HostPool {}

impl HostPool {
    /// Maps `len` bytes (rounded up to the page size by the kernel).
    pub fn new(len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "pool length is zero",
            ));
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if empty (never: creation refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte of `pool`, null without one: what a transport that
    /// may run without its own pool answers for `PoolOwner::pool_ptr`.
    pub fn ptr_of(pool: Option<&Self>) -> *mut u8 {
        pool.map_or(std::ptr::null_mut(), Self::ptr)
    }

    /// The length of `pool`, 0 without one (`PoolOwner::pool_len`).
    pub fn len_of(pool: Option<&Self>) -> usize {
        pool.map_or(0, Self::len)
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_writable_memory_and_refuses_zero() {
        let p = HostPool::new(1 << 20).unwrap();
        assert_eq!(p.len(), 1 << 20);
        // SAFETY: inside the fresh mapping.
        unsafe {
            p.ptr().write(7);
            p.ptr().add((1 << 20) - 1).write(9);
            assert_eq!(p.ptr().read(), 7);
        }
        assert_eq!(
            HostPool::new(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
