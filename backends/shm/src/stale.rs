//! Removal of the objects of processes that died without unlinking them
//! (`kill -9`, a crash): their names carry the owner's pid.

use std::ffi::CString;

use crate::pool::prefix;

/// Unlinks every `/dev/shm/<prefix>-<pid>-<n>` object whose process no
/// longer exists; returns the names removed. The prefix is `ferry` unless
/// `FERRY_SHM_PREFIX` says otherwise.
pub fn clean_stale() -> Vec<String> {
    clean_stale_with_prefix(&prefix())
}

/// Like [`clean_stale`], for objects named `<prefix>-<pid>-<n>`.
pub fn clean_stale_with_prefix(prefix: &str) -> Vec<String> {
    let prefix = format!("{prefix}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = owner_pid(name, &prefix) else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let Ok(c) = CString::new(format!("/{name}")) else {
            continue;
        };
        // SAFETY: c is a valid NUL-terminated object name.
        if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
            removed.push(name.to_owned());
        }
    }
    removed
}

/// The pid in `<prefix><pid>-<n>`, if `name` has that shape.
fn owner_pid(name: &str, prefix: &str) -> Option<libc::pid_t> {
    let rest = name.strip_prefix(prefix)?;
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_strictly() {
        assert_eq!(owner_pid("ferry-12-0", "ferry-"), Some(12));
        assert_eq!(owner_pid("ferry-12-", "ferry-"), None);
        assert_eq!(owner_pid("ferry-x-1", "ferry-"), None);
        assert_eq!(owner_pid("ferry-0-1", "ferry-"), None);
        assert_eq!(owner_pid("other-12-0", "ferry-"), None);
    }

    #[test]
    fn the_living_are_left_alone() {
        assert!(alive(std::process::id() as libc::pid_t));
    }
}
