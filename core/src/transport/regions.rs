//! The table of registered regions every data plane keeps: ids handed out
//! in order, a bound on how many (what a peer can be told of), lookup by
//! id with the one bounds check, and what the plane keeps beside each (a
//! memory key, a registration handle); and the error of a range that lies
//! in none of a peer's regions ([`OutsidePeerRegions`]) or of this side's
//! own ([`OutsideOwnRegions`]).

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use super::{FaultKind, Region, RegionError};

/// A one-sided operation's range in a peer's memory (a write's
/// destination, a read's source) that lies in none of the regions the
/// peer's session id lists: what the RDMA data planes refuse before they
/// post, in one vocabulary (each backend's error wraps it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsidePeerRegions {
    /// True for a read (the range is its source), false for a write (its
    /// destination).
    pub read: bool,
    /// The peer's session id.
    pub peer: String,
    /// The range's first byte, in the peer's space.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// How many regions the peer listed.
    pub regions: usize,
}

impl OutsidePeerRegions {
    /// What kind of failure it is: a write or read outside registered
    /// memory.
    pub const fn kind(&self) -> FaultKind {
        FaultKind::OutOfBounds
    }
}

impl fmt::Display for OutsidePeerRegions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_range(f, self.read, self.len, self.addr, ["from", "to"])?;
        write!(
            f,
            " lies in none of peer {}'s {} registered region(s)",
            self.peer, self.regions
        )
    }
}

impl core::error::Error for OutsidePeerRegions {}

/// A one-sided operation's range in this side's own memory (a write's
/// source, a read's destination) that lies in none of the regions its
/// engine registered: what the engines refuse before they post, whichever
/// data plane carries the bytes (each engine's error wraps it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideOwnRegions {
    /// True for a read (the range is its destination), false for a write
    /// (its source).
    pub read: bool,
    /// The range's first byte.
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl OutsideOwnRegions {
    /// What kind of failure it is: a write or read outside registered
    /// memory.
    pub const fn kind(&self) -> FaultKind {
        FaultKind::OutOfBounds
    }
}

impl fmt::Display for OutsideOwnRegions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_range(f, self.read, self.len, self.addr, ["into", "from"])?;
        f.write_str(" falls outside every region this engine registered")
    }
}

impl core::error::Error for OutsideOwnRegions {}

/// Writes `<op> of <len> bytes <way> <addr>`, how both refusals of a
/// range begin; `ways` holds the preposition for a read, then for a
/// write.
fn write_range(
    f: &mut fmt::Formatter<'_>,
    read: bool,
    len: u64,
    addr: u64,
    ways: [&str; 2],
) -> fmt::Result {
    let (op, way) = if read {
        ("read", ways[0])
    } else {
        ("write", ways[1])
    };
    write!(f, "{op} of {len} bytes {way} {addr:#x}")
}

/// A data plane's registered regions, each with the plane's own `T`.
#[derive(Debug)]
pub struct Regions<T> {
    list: Vec<(Region, T)>,
    next_id: u32,
    max: usize,
}

impl<T> Regions<T> {
    /// An empty table that holds at most `max` regions; ids start at 1.
    pub fn new(max: usize) -> Self {
        Self {
            list: Vec::new(),
            next_id: 1,
            max,
        }
    }

    /// How many are registered.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True if none is.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Refuses a registration the table has no room for, before the plane
    /// asks its device for one.
    pub fn check_room(&self) -> Result<(), RegionError> {
        if self.list.len() >= self.max {
            return Err(RegionError::TooMany { max: self.max });
        }
        Ok(())
    }

    /// Registers `len` bytes at `addr` with the plane's `with`, under the
    /// next id (never 0).
    pub fn insert(&mut self, addr: u64, len: u64, with: T) -> Result<Region, RegionError> {
        self.check_room()?;
        let region = Region {
            id: self.next_id,
            addr,
            len,
        };
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.list.push((region, with));
        Ok(region)
    }

    /// The region registered under `id`, with the plane's own.
    pub fn get(&self, id: u32) -> Result<(&Region, &T), RegionError> {
        self.list
            .iter()
            .find(|(r, _)| r.id == id)
            .map(|(r, t)| (r, t))
            .ok_or(RegionError::Unknown(id))
    }

    /// The registered region `region` names, checked to hold `len` bytes
    /// at `offset` (a write's source, a read's destination): the bounds
    /// check every data plane makes before it posts.
    pub fn source(
        &self,
        region: Region,
        offset: u64,
        len: u64,
    ) -> Result<(&Region, &T), RegionError> {
        let (r, t) = self.get(region.id)?;
        r.check_source(offset, len)?;
        Ok((r, t))
    }

    /// Takes `region` out of the table, giving back the plane's own.
    pub fn remove(&mut self, region: Region) -> Result<T, RegionError> {
        let at = self
            .list
            .iter()
            .position(|(r, _)| r.id == region.id)
            .ok_or(RegionError::Unknown(region.id))?;
        Ok(self.list.remove(at).1)
    }

    /// Every region, in the order registered.
    pub fn iter(&self) -> impl Iterator<Item = (&Region, &T)> {
        self.list.iter().map(|(r, t)| (r, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_bounds_and_room() {
        let mut t = Regions::new(2);
        let a = t.insert(0x1000, 100, 'a').unwrap();
        let b = t.insert(0x9000, 50, 'b').unwrap();
        assert_eq!((a.id, b.id), (1, 2));
        assert_eq!(t.insert(0, 1, 'c'), Err(RegionError::TooMany { max: 2 }));
        assert_eq!(t.source(a, 90, 10).unwrap().1, &'a');
        assert!(matches!(
            t.source(a, 90, 11),
            Err(RegionError::SourceOutOfBounds { region: 1, .. })
        ));
        assert_eq!(t.remove(a), Ok('a'));
        assert_eq!(t.remove(a), Err(RegionError::Unknown(1)));
        assert!(t.get(1).is_err());
        let c = t.insert(0, 1, 'c').unwrap();
        assert_eq!(c.id, 3);
        assert_eq!(t.iter().map(|(_, v)| *v).collect::<Vec<_>>(), ['b', 'c']);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_range_outside_a_peers_regions_says_which_way_and_whose() {
        let mut e = OutsidePeerRegions {
            read: false,
            peer: "p".into(),
            addr: 0x40,
            len: 8,
            regions: 2,
        };
        assert_eq!(
            alloc::format!("{e}"),
            "write of 8 bytes to 0x40 lies in none of peer p's 2 registered region(s)"
        );
        e.read = true;
        assert_eq!(
            alloc::format!("{e}"),
            "read of 8 bytes from 0x40 lies in none of peer p's 2 registered region(s)"
        );
        assert_eq!(e.kind(), FaultKind::OutOfBounds);
    }
}
