//! Shared-memory session ids: `shm:<object name>@<base address, hex>+<length>`.
//!
//! The seed's `dest_addr` is an address in the receiver's address space
//! (`pool_ptr + slot_offset`), so a peer needs the receiver's base address to
//! turn it into an offset in the object, and the object's length to check it.

use std::fmt::{self, Write as _};

use crate::error::ShmError;

/// A parsed shared-memory session id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionId<'a> {
    /// The object's name (`/ferry-…`).
    pub name: &'a str,
    /// The pool's base address in its owner.
    pub base: u64,
    /// The pool's length.
    pub len: u64,
}

impl<'a> SessionId<'a> {
    /// Parses `shm:<name>@<hex base>+<len>`.
    pub fn parse(s: &'a str) -> Result<Self, ShmError> {
        let bad = |why| ShmError::BadSession {
            session: s.to_owned(),
            why,
        };
        let rest = s
            .strip_prefix("shm:")
            .ok_or_else(|| bad("no shm: prefix"))?;
        let (name, tail) = rest.rsplit_once('@').ok_or_else(|| bad("no @base"))?;
        let (base, len) = tail.split_once('+').ok_or_else(|| bad("no +length"))?;
        let valid_name = name.len() > 1
            && name.len() <= 255
            && name.starts_with('/')
            && !name[1..].contains('/')
            && name.bytes().all(|b| b.is_ascii_graphic());
        if !valid_name {
            return Err(bad("object name must be /<name> without further slashes"));
        }
        let base = u64::from_str_radix(base, 16).map_err(|_| bad("base is not hex"))?;
        let len: u64 = len.parse().map_err(|_| bad("length is not a number"))?;
        if len == 0 || base.checked_add(len).is_none() {
            return Err(bad("empty pool or base + length overflows"));
        }
        Ok(Self { name, base, len })
    }
}

impl fmt::Display for SessionId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("shm:")?;
        f.write_str(self.name)?;
        f.write_char('@')?;
        write!(f, "{:x}+{}", self.base, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let s = SessionId {
            name: "/ferry-12-0",
            base: 0x7f00_1234_0000,
            len: 1 << 30,
        };
        let text = s.to_string();
        assert_eq!(text, "shm:/ferry-12-0@7f0012340000+1073741824");
        assert_eq!(SessionId::parse(&text).unwrap(), s);
    }

    #[test]
    fn rejects_what_is_not_a_session() {
        for bad in [
            "",
            "tcp://x",
            "shm:/a@zz+1",
            "shm:/a@10",
            "shm:/a@10+0",
            "shm:/a@10+x",
            "shm:a@10+1",
            "shm:/a/b@10+1",
            "shm:/@10+1",
            "shm:/a b@10+1",
            "shm:/a@ffffffffffffffff+2",
        ] {
            assert!(
                matches!(SessionId::parse(bad), Err(ShmError::BadSession { .. })),
                "{bad}"
            );
        }
    }
}
