//! Where a slot lies in its pool.

/// A range of a pool's bytes: a slot's place, by offset and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolRange {
    /// Its first byte's offset in the pool.
    pub offset: u64,
    /// Its length in bytes.
    pub size: u64,
}

impl PoolRange {
    /// The range of `size` bytes at `offset`.
    pub const fn new(offset: u64, size: u64) -> Self {
        Self { offset, size }
    }

    /// True if the `len` bytes at `offset` lie inside it; false where
    /// either end lies past `u64::MAX`.
    pub const fn contains(&self, offset: u64, len: u64) -> bool {
        match (offset.checked_add(len), self.offset.checked_add(self.size)) {
            (Some(end), Some(own_end)) => offset >= self.offset && end <= own_end,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PoolRange;

    #[test]
    fn a_range_contains_what_lies_inside_it_and_nothing_that_wraps() {
        let r = PoolRange::new(4096, 1024);
        assert!(r.contains(4096, 1024));
        assert!(r.contains(5000, 120));
        assert!(r.contains(5120, 0));
        assert!(!r.contains(4095, 1));
        assert!(!r.contains(5000, 121));
        assert!(!r.contains(u64::MAX, 2));
        assert!(!PoolRange::new(u64::MAX, 2).contains(u64::MAX, 0));
    }
}
