//! Storage a state machine either borrows from its caller or (with the
//! `alloc` feature) owns, as smoltcp's `ManagedSlice` does: the no_std,
//! allocation-free build keeps caller storage, and a std runtime, a test or
//! a simulator gets a machine that owns its tables, without a
//! self-referential pair of storage and machine.

use core::fmt;
use core::ops::{Deref, DerefMut};

/// A table of `T`: a caller's slice, or (feature `alloc`) a vector of its
/// own. Everything a machine does with it goes through `[T]`.
pub enum ManagedSlice<'s, T> {
    /// The caller's storage, for as long as the machine lives.
    Borrowed(&'s mut [T]),
    /// Storage the machine owns.
    #[cfg(feature = "alloc")]
    Owned(alloc::vec::Vec<T>),
}

impl<'s, T> ManagedSlice<'s, T> {
    /// The first `len` elements (all of them if there are fewer).
    pub fn truncated(self, len: usize) -> Self {
        match self {
            Self::Borrowed(s) => {
                let len = len.min(s.len());
                Self::Borrowed(&mut s[..len])
            }
            #[cfg(feature = "alloc")]
            Self::Owned(mut v) => {
                v.truncate(len);
                Self::Owned(v)
            }
        }
    }
}

impl<T> Deref for ManagedSlice<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::Borrowed(s) => s,
            #[cfg(feature = "alloc")]
            Self::Owned(v) => v,
        }
    }
}

impl<T> DerefMut for ManagedSlice<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Self::Borrowed(s) => s,
            #[cfg(feature = "alloc")]
            Self::Owned(v) => v,
        }
    }
}

impl<T> fmt::Debug for ManagedSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The contents are a machine's tables: their size is what helps.
        f.debug_struct("ManagedSlice")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl<'s, T> From<&'s mut [T]> for ManagedSlice<'s, T> {
    fn from(s: &'s mut [T]) -> Self {
        Self::Borrowed(s)
    }
}

impl<'s, T, const N: usize> From<&'s mut [T; N]> for ManagedSlice<'s, T> {
    fn from(s: &'s mut [T; N]) -> Self {
        Self::Borrowed(s)
    }
}

#[cfg(feature = "alloc")]
impl<'s, T> From<&'s mut alloc::vec::Vec<T>> for ManagedSlice<'s, T> {
    fn from(v: &'s mut alloc::vec::Vec<T>) -> Self {
        Self::Borrowed(v)
    }
}

#[cfg(feature = "alloc")]
impl<T> From<alloc::vec::Vec<T>> for ManagedSlice<'_, T> {
    fn from(v: alloc::vec::Vec<T>) -> Self {
        Self::Owned(v)
    }
}

/// `n` empty places, owned.
#[cfg(feature = "alloc")]
pub(crate) fn empty<T>(n: usize) -> ManagedSlice<'static, Option<T>> {
    ManagedSlice::Owned((0..n).map(|_| None).collect())
}

/// `n` copies of `value`, owned.
#[cfg(feature = "alloc")]
pub(crate) fn filled<T: Clone>(n: usize, value: T) -> ManagedSlice<'static, T> {
    ManagedSlice::Owned(alloc::vec![value; n])
}
