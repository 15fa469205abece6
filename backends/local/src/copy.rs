//! Copying between this process's memory and a peer's with cross-memory
//! attach (`process_vm_writev` into the peer, `process_vm_readv` out of
//! it): pieces grouped into as few system calls as the kernel takes
//! (`IOV_MAX` ranges each), and, for large copies, cut and spread over a
//! copier's threads, since one kernel copy runs at about half of what a
//! core's `memcpy` does and the memory bus has room for more.
#![allow(unsafe_code)]

use std::fmt;
use std::io;

use tensorferry_core::transport::OutsideOwnRegions;
use tensorferry_hostmem::Copier;

/// One range to copy: `len` bytes from `src` to `dst`. For a write `src`
/// is in this process and `dst` in the peer; for a read, the other way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// The first source byte: in this process for a write, in the peer's
    /// address space for a read.
    pub src: u64,
    /// The first destination byte: in the peer's address space for a
    /// write, in this process for a read.
    pub dst: u64,
    /// How many bytes.
    pub len: u64,
}

/// Which way bytes go between this process and a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From this process's registered memory into the peer's: an
    /// [`Op`]'s `src` is here, its `dst` in the peer.
    Write,
    /// From the peer's registered memory into this process's: an
    /// [`Op`]'s `src` is in the peer, its `dst` here.
    Read,
}

impl Direction {
    /// The system call that copies this way.
    pub fn call(self) -> &'static str {
        match self {
            Self::Write => "process_vm_writev",
            Self::Read => "process_vm_readv",
        }
    }

    /// Its range `(addr, len)` in this process, refused as lying in none
    /// of this engine's regions.
    pub fn outside_own(self, addr: u64, len: u64) -> OutsideOwnRegions {
        OutsideOwnRegions {
            read: self == Self::Read,
            addr,
            len,
        }
    }

    /// Where `op` starts in this process.
    pub fn local(self, op: &Op) -> u64 {
        match self {
            Self::Write => op.src,
            Self::Read => op.dst,
        }
    }

    /// Where `op` starts in the peer.
    pub fn remote(self, op: &Op) -> u64 {
        match self {
            Self::Write => op.dst,
            Self::Read => op.src,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Write => "write",
            Self::Read => "read",
        })
    }
}

/// Ranges one `process_vm_writev` or `process_vm_readv` takes (Linux's
/// `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// What a parallel copy is cut into.
pub(crate) const PIECE: u64 = 4 << 20;

/// A failed group: how many of its bytes reached their destination, and
/// the OS error (`None`: the kernel stopped short without one).
pub(crate) struct Short {
    pub written: u64,
    pub len: u64,
    pub error: Option<io::Error>,
}

/// Cuts `ops` into pieces of at most `piece` bytes (0: no cutting) and
/// groups consecutive pieces into calls of at most `IOV_MAX` ranges and,
/// when cutting, about `piece` bytes.
pub(crate) fn plan(ops: &[Op], piece: u64) -> Vec<Vec<Op>> {
    let mut groups = Vec::new();
    let mut group: Vec<Op> = Vec::new();
    let mut bytes = 0u64;
    for op in ops.iter().filter(|o| o.len > 0) {
        let mut off = 0;
        while off < op.len {
            let len = if piece == 0 {
                op.len - off
            } else {
                (op.len - off).min(piece)
            };
            group.push(Op {
                src: op.src + off,
                dst: op.dst + off,
                len,
            });
            bytes += len;
            off += len;
            if group.len() == IOV_MAX || (piece != 0 && bytes >= piece) {
                groups.push(core::mem::take(&mut group));
                bytes = 0;
            }
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// Copies one group between this process and process `pid`, `dir`'s way,
/// with one system call (more if the kernel copies part and asks to be
/// called again for the rest, which it does not do for copies that fault,
/// those stop short).
fn copy_group(pid: i32, group: &[Op], dir: Direction) -> Result<(), Short> {
    let total: u64 = group.iter().map(|o| o.len).sum();
    let iovecs = |addr: &dyn Fn(&Op) -> u64| -> Vec<libc::iovec> {
        group
            .iter()
            .map(|o| libc::iovec {
                iov_base: addr(o) as usize as *mut libc::c_void,
                iov_len: o.len as usize,
            })
            .collect()
    };
    let local = iovecs(&|o| dir.local(o));
    let remote = iovecs(&|o| dir.remote(o));
    let (liov, lcnt) = (local.as_ptr(), local.len() as libc::c_ulong);
    let (riov, rcnt) = (remote.as_ptr(), remote.len() as libc::c_ulong);
    loop {
        let n = match dir {
            // SAFETY: the local ranges lie in regions this engine
            // registered (checked by the caller), which the application
            // keeps mapped while registered; the kernel reads them and
            // writes only into the peer's address space, checking every
            // remote range itself.
            Direction::Write => unsafe { libc::process_vm_writev(pid, liov, lcnt, riov, rcnt, 0) },
            // SAFETY: the local ranges lie in regions this engine
            // registered (checked by the caller), whose bytes the
            // application hands over while the read is posted; the kernel
            // writes only into them, and checks every remote range itself.
            Direction::Read => unsafe { libc::process_vm_readv(pid, liov, lcnt, riov, rcnt, 0) },
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Short {
                written: 0,
                len: total,
                error: Some(e),
            });
        }
        let n = n as u64;
        return if n == total {
            Ok(())
        } else {
            Err(Short {
                written: n,
                len: total,
                error: None,
            })
        };
    }
}

/// Writes one group into process `pid` (`process_vm_writev`).
pub(crate) fn write_group(pid: i32, group: &[Op]) -> Result<(), Short> {
    copy_group(pid, group, Direction::Write)
}

/// Reads one group out of process `pid` (`process_vm_readv`).
pub(crate) fn read_group(pid: i32, group: &[Op]) -> Result<(), Short> {
    copy_group(pid, group, Direction::Read)
}

/// Writes every group, over the copier's threads, stopping at the first
/// failure.
pub(crate) fn write_all(pid: i32, groups: &[Vec<Op>], copier: &Copier) -> Result<(), Short> {
    copier.try_each(groups, |g| write_group(pid, g))
}

/// Reads every group, over the copier's threads, stopping at the first
/// failure.
pub(crate) fn read_all(pid: i32, groups: &[Vec<Op>], copier: &Copier) -> Result<(), Short> {
    copier.try_each(groups, |g| read_group(pid, g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(src: u64, dst: u64, len: u64) -> Op {
        Op { src, dst, len }
    }

    #[test]
    fn plans_cut_large_writes_and_group_small_ones() {
        // Uncut: one call for a batch, empty ranges dropped.
        let g = plan(&[op(0, 100, 10), op(10, 200, 0), op(20, 300, 5)], 0);
        assert_eq!(g, vec![vec![op(0, 100, 10), op(20, 300, 5)]]);
        // Cut: 10 MiB in pieces of 4, each its own call.
        let m = 1 << 20;
        let g = plan(&[op(0, 1000, 10 * m)], 4 * m);
        assert_eq!(
            g,
            vec![
                vec![op(0, 1000, 4 * m)],
                vec![op(4 * m, 1000 + 4 * m, 4 * m)],
                vec![op(8 * m, 1000 + 8 * m, 2 * m)],
            ]
        );
        // More ranges than one call takes.
        let many: Vec<Op> = (0..2500).map(|i| op(i, i, 1)).collect();
        let g = plan(&many, 0);
        assert_eq!(
            g.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![1024, 1024, 452]
        );
    }

    #[test]
    fn a_write_into_this_process_lands_and_a_bad_one_stops_short() {
        let src = vec![7u8; 64 << 10];
        let mut dst = vec![0u8; 64 << 10];
        let me = std::process::id() as i32;
        let ops = [op(src.as_ptr() as u64, dst.as_mut_ptr() as u64, 64 << 10)];
        let copier = Copier::new(2, 1, "test-local").unwrap();
        write_all(me, &plan(&ops, 16 << 10), &copier).ok().unwrap();
        assert!(dst.iter().all(|b| *b == 7));
        let bad = [op(src.as_ptr() as u64, 8, 16)];
        let e = write_all(
            me,
            &plan(&bad, 0),
            &Copier::new(1, 1, "test-local").unwrap(),
        )
        .err()
        .unwrap();
        assert_eq!(e.written, 0);
        assert_eq!(e.error.unwrap().raw_os_error(), Some(libc::EFAULT));
    }

    #[test]
    fn a_read_from_this_process_lands_and_a_bad_one_stops_short() {
        let src: Vec<u8> = (0..64u32 << 10).map(|i| (i * 3 + 1) as u8).collect();
        let mut dst = vec![0u8; 64 << 10];
        let me = std::process::id() as i32;
        // For a read, `src` is the peer's and `dst` this process's.
        let ops = [op(src.as_ptr() as u64, dst.as_mut_ptr() as u64, 64 << 10)];
        let copier = Copier::new(2, 1, "test-local").unwrap();
        read_all(me, &plan(&ops, 16 << 10), &copier).ok().unwrap();
        assert!(dst == src);
        // A source the "peer" has not mapped.
        let bad = [op(8, dst.as_mut_ptr() as u64, 16)];
        let e = read_all(me, &plan(&bad, 0), &copier).err().unwrap();
        assert_eq!(e.written, 0);
        assert_eq!(e.error.unwrap().raw_os_error(), Some(libc::EFAULT));
    }
}
