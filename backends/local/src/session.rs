//! The session id a local engine advertises:
//! `local:<host>:<pid>:<fd>:<nonce>`.
//!
//! `<host>` is the kernel's boot id and the inode of the process's pid
//! namespace (`<boot id, 32 hex>.<inode, hex>`): a process id means
//! something only to processes that share both, so a session from anywhere
//! else is refused by name rather than written into whatever process has
//! that number here. `<fd>` is the descriptor of the engine's region table
//! in its process, and `<nonce>` (16 hex) is repeated inside the table, so
//! that a descriptor or process id reused after the engine is gone is not
//! mistaken for it.

use std::fmt;
use std::os::unix::fs::MetadataExt;

use crate::error::LocalError;

/// The prefix every local session id starts with.
pub const PREFIX: &str = "local:";

/// A parsed local session id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The host and pid namespace.
    pub host: String,
    /// The engine's process.
    pub pid: i32,
    /// Its table's descriptor in that process.
    pub fd: i32,
    /// The nonce its table repeats.
    pub nonce: u64,
}

impl Session {
    /// Parses `text`, naming what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, LocalError> {
        let bad = |why| LocalError::BadSession {
            session: text.to_owned(),
            why,
        };
        let rest = text
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("it does not start with \"local:\""))?;
        let mut parts = rest.split(':');
        let (Some(host), Some(pid), Some(fd), Some(nonce), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad("it is not local:<host>:<pid>:<fd>:<nonce>"));
        };
        if host.is_empty() || !host.bytes().all(|b| b.is_ascii_hexdigit() || b == b'.') {
            return Err(bad("its host is not hex"));
        }
        let pid: i32 = pid.parse().map_err(|_| bad("its pid is not a number"))?;
        let fd: i32 = fd
            .parse()
            .map_err(|_| bad("its descriptor is not a number"))?;
        if pid <= 0 || fd < 0 {
            return Err(bad("its pid or descriptor is out of range"));
        }
        let nonce = u64::from_str_radix(nonce, 16).map_err(|_| bad("its nonce is not hex"))?;
        Ok(Self {
            host: host.to_owned(),
            pid,
            fd,
            nonce,
        })
    }
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}:{}:{}:{:016x}",
            self.host, self.pid, self.fd, self.nonce
        )
    }
}

/// This process's host and pid namespace, as session ids name them.
pub fn this_host() -> Result<String, LocalError> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map_err(|source| {
        LocalError::Sys {
            call: "read /proc/sys/kernel/random/boot_id",
            source,
        }
    })?;
    let boot: String = boot.trim().chars().filter(|c| *c != '-').collect();
    let ns = std::fs::metadata("/proc/self/ns/pid").map_err(|source| LocalError::Sys {
        call: "stat /proc/self/ns/pid",
        source,
    })?;
    Ok(format!("{boot}.{:x}", ns.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_round_trips_and_bad_ones_say_why() {
        let s = Session {
            host: "ab12.f0".into(),
            pid: 42,
            fd: 7,
            nonce: 0xdead_beef,
        };
        let text = s.to_string();
        assert_eq!(text, "local:ab12.f0:42:7:00000000deadbeef");
        assert_eq!(Session::parse(&text).unwrap(), s);
        for (bad, why) in [
            ("shm:x@0+1", "does not start"),
            ("local:ab:1:2", "is not local:"),
            ("local:ab:1:2:3:4", "is not local:"),
            ("local:zz:1:2:3", "host is not hex"),
            ("local:ab:x:2:3", "pid is not"),
            ("local:ab:0:2:3", "out of range"),
            ("local:ab:1:2:xyz", "nonce is not hex"),
        ] {
            let e = Session::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn this_host_names_the_boot_and_the_pid_namespace() {
        let h = this_host().unwrap();
        let (boot, ns) = h.split_once('.').unwrap();
        assert_eq!(boot.len(), 32);
        assert!(u64::from_str_radix(ns, 16).is_ok());
    }
}
