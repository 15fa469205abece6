//! The sizes of a state machine's tables, for the storage it owns
//! (`InstanceStorage::owned`, `CoordinatorStorage::owned`).

use core::fmt;

use super::instance::MAX_REQUESTS;

/// Table sizes of a state machine.
///
/// Every lookup costs the same whatever the sizes (the tables are hash
/// indexed), so they are set by the memory a deployment can spend. What
/// each costs, on a 64-bit target:
///
/// | limit | coordinator | instance |
/// |---|---|---|
/// | `requests` | about 1.2 KiB a transfer (its record, index, timer, queued messages and events, parked place), plus `nested_per_request` | about 2.9 KiB a request (likewise), plus `nested_per_request` |
/// | `nested_per_request` | bytes per transfer (zeroed by the allocator: pages are touched as used) | bytes per request (likewise) |
/// | `tombstones` | about 0.12 KiB each | about 0.12 KiB each |
/// | `members` | about 2.6 KiB an instance (room for 32 preallocated slots included) | not used |
/// | `prealloc_per_member` | a parked-slot record (about 0.1 KiB) per member for each | not used |
///
/// [`Limits::default`] is a coordinator's for a deployment of hundreds of
/// instances: 16,384 transfers in flight, 1,024 instances, and 65,536
/// ended legs remembered (about five minutes of ids at 200 hand-offs a
/// second): about 22 MiB of tables and 8 MiB of tombstones, and 256 MiB of
/// address space for nested JSON. [`Limits::INSTANCE`] is an instance's:
/// about 3 MiB of tables, 8 MiB of tombstones, 16 MiB of address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests (instance) or transfers (coordinator) in flight at once.
    pub requests: usize,
    /// Bytes of manifest plus scalar fields one request may carry.
    pub nested_per_request: usize,
    /// Ended requests remembered, to ignore late duplicates.
    pub tombstones: usize,
    /// Instances a coordinator may have registered at once.
    pub members: usize,
    /// Preallocated slots a coordinator takes from each instance (the
    /// fast path's receive slots; a registration with more is refused), at
    /// most [`MAX_PREALLOC_PER_MEMBER`](super::coordinator::MAX_PREALLOC_PER_MEMBER).
    pub prealloc_per_member: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self::COORDINATOR
    }
}

/// A limit out of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitsError {
    /// Which limit: `requests`, `nested_per_request`, `tombstones`,
    /// `members` or `prealloc_per_member`.
    pub field: &'static str,
    /// Its value.
    pub value: usize,
    /// The least it may be.
    pub min: usize,
    /// The most it may be.
    pub max: usize,
}

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = if self.value < self.min {
            "too small"
        } else {
            "too large"
        };
        write!(
            f,
            "limit `{}` is {side}: {}, must be {} to {}",
            self.field, self.value, self.min, self.max
        )
    }
}

impl core::error::Error for LimitsError {}

/// Storage given to a machine that is not as long as its part's
/// `storage_needed` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageError {
    /// The machine's part the slice is for (`transfers`,
    /// `transfers.requests`).
    pub part: &'static str,
    /// The slice: the storage's field (`held`).
    pub field: &'static str,
    /// The length it must have.
    pub needed: usize,
    /// The length it has.
    pub given: usize,
}

impl StorageError {
    /// `Err` naming `part` and `field` unless `given` is `needed`.
    pub fn check(
        part: &'static str,
        field: &'static str,
        needed: usize,
        given: usize,
    ) -> Result<(), Self> {
        if needed == given {
            Ok(())
        } else {
            Err(Self {
                part,
                field,
                needed,
                given,
            })
        }
    }

    /// The first of `slices` (field, length needed, length given) whose
    /// length is not the one needed, named as `part`'s.
    pub(crate) fn check_each<const N: usize>(
        part: &'static str,
        slices: [(&'static str, usize, usize); N],
    ) -> Result<(), Self> {
        slices
            .into_iter()
            .try_for_each(|(field, needed, given)| Self::check(part, field, needed, given))
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "storage `{}.{}` holds {}, must hold {}",
            self.part, self.field, self.given, self.needed
        )
    }
}

impl core::error::Error for StorageError {}

impl Limits {
    /// A coordinator's tables for a deployment (see the table above).
    pub const COORDINATOR: Self = Self {
        requests: 16 * 1024,
        nested_per_request: 16 * 1024,
        tombstones: 64 * 1024,
        members: 1024,
        prealloc_per_member: 16,
    };

    /// An instance's tables: 1,024 requests in flight (more than its pool
    /// has slots, in any deployment ferry knows), and as many tombstones as
    /// a coordinator's.
    pub const INSTANCE: Self = Self {
        requests: 1024,
        nested_per_request: 16 * 1024,
        tombstones: 64 * 1024,
        members: 1,
        prealloc_per_member: 16,
    };

    /// The least room for nested JSON a request needs (`{}` twice, and a
    /// small manifest).
    pub const MIN_NESTED: usize = 64;

    /// Checks every limit against what the machines can index: requests
    /// from 1 to 65,536 (an instance's tokens carry its table index in 16
    /// bits), nested JSON from 64 bytes to 16 MiB, tombstones from 1 to
    /// 2^24 and members from 1 to 2^24 (a receiver's rank carries its index
    /// in 24 bits). The error names the first limit out of range.
    pub fn check(&self) -> Result<(), LimitsError> {
        let checks = [
            ("requests", self.requests, 1, MAX_REQUESTS),
            (
                "nested_per_request",
                self.nested_per_request,
                Self::MIN_NESTED,
                16 << 20,
            ),
            ("tombstones", self.tombstones, 1, 1 << 24),
            ("members", self.members, 1, 1 << 24),
            (
                "prealloc_per_member",
                self.prealloc_per_member,
                0,
                super::coordinator::MAX_PREALLOC_PER_MEMBER,
            ),
        ];
        for (field, value, min, max) in checks {
            if !(min..=max).contains(&value) {
                return Err(LimitsError {
                    field,
                    value,
                    min,
                    max,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate alloc;
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn the_defaults_pass_and_the_error_names_the_limit() {
        assert_eq!(Limits::default().check(), Ok(()));
        assert_eq!(Limits::INSTANCE.check(), Ok(()));
        let tiny = Limits {
            nested_per_request: 8,
            ..Limits::default()
        };
        let e = tiny.check().unwrap_err();
        assert_eq!(e.field, "nested_per_request");
        assert!(e
            .to_string()
            .contains("`nested_per_request` is too small: 8"));
        let none = Limits {
            members: 0,
            ..Limits::default()
        };
        assert_eq!(none.check().unwrap_err().field, "members");
        let huge = Limits {
            requests: MAX_REQUESTS + 1,
            ..Limits::default()
        };
        assert!(huge.check().unwrap_err().to_string().contains("too large"));
        let slots = Limits {
            prealloc_per_member: super::super::coordinator::MAX_PREALLOC_PER_MEMBER + 1,
            ..Limits::default()
        };
        assert_eq!(slots.check().unwrap_err().field, "prealloc_per_member");
    }
}
