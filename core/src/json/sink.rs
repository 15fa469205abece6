//! A writer into caller storage that keeps counting past the end, so that a
//! failed encode still reports the size it needed.

use core::fmt;

/// The caller's buffer was too small; `needed` bytes would have fit the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferTooSmall {
    /// The size the output needs, in bytes.
    pub needed: usize,
}

impl fmt::Display for BufferTooSmall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "output buffer too small: {} bytes needed", self.needed)
    }
}

/// Output into a caller buffer. Writes past the end are counted, not stored.
pub struct Sink<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> Sink<'b> {
    /// A sink over `buf`; an empty buffer gives a pure size counter.
    pub fn new(buf: &'b mut [u8]) -> Self {
        Self { buf, len: 0 }
    }

    /// Appends `bytes` (or only counts them once the buffer is full).
    #[inline(always)]
    pub fn put(&mut self, bytes: &[u8]) {
        let end = self.len.saturating_add(bytes.len());
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            copy_small(dst, bytes);
        }
        self.len = end;
    }

    /// Appends `bytes` between double quotes, as one reservation.
    #[inline(always)]
    pub(crate) fn put_quoted(&mut self, bytes: &[u8]) {
        let n = bytes.len().saturating_add(2);
        if let Some(dst) = self.spare(n) {
            if let Some((open, rest)) = dst.split_first_mut() {
                *open = b'"';
                if let Some((close, body)) = rest.split_last_mut() {
                    *close = b'"';
                    copy_small(body, bytes);
                }
            }
        }
        self.advance(n);
    }

    /// Appends one byte.
    #[inline(always)]
    pub fn byte(&mut self, b: u8) {
        if let Some(dst) = self.buf.get_mut(self.len) {
            *dst = b;
        }
        self.len = self.len.saturating_add(1);
    }

    /// The next `n` bytes of the buffer, if they fit, for writing in place;
    /// follow with [`advance`](Self::advance)`(n)` whether or not they fit.
    #[inline]
    pub(crate) fn spare(&mut self, n: usize) -> Option<&mut [u8]> {
        let end = self.len.checked_add(n)?;
        self.buf.get_mut(self.len..end)
    }

    /// Counts `n` bytes written through [`spare`](Self::spare).
    #[inline]
    pub(crate) fn advance(&mut self, n: usize) {
        self.len = self.len.saturating_add(n);
    }

    /// Bytes written or counted so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The output length, or the size that was needed if it did not fit.
    pub fn finish(self) -> Result<usize, BufferTooSmall> {
        if self.len <= self.buf.len() {
            Ok(self.len)
        } else {
            Err(BufferTooSmall { needed: self.len })
        }
    }
}

impl fmt::Write for Sink<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.put(s.as_bytes());
        Ok(())
    }
}

impl Sink<'_> {
    /// Forgets everything written after the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl core::error::Error for BufferTooSmall {}

/// `dst.copy_from_slice(src)` for slices of equal length, without a call
/// into `memcpy` for the short pieces (keys, numbers, names, ids) that
/// make up most of a message: up to 32 bytes move as two overlapping
/// fixed-size copies.
#[inline]
fn copy_small(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if n != dst.len() {
        return;
    }
    match n {
        0 => {}
        1..=3 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
        4..=7 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[n - 4..].copy_from_slice(&src[n - 4..]);
        }
        8..=16 => {
            dst[..8].copy_from_slice(&src[..8]);
            dst[n - 8..].copy_from_slice(&src[n - 8..]);
        }
        17..=32 => {
            dst[..16].copy_from_slice(&src[..16]);
            dst[n - 16..].copy_from_slice(&src[n - 16..]);
        }
        _ => dst.copy_from_slice(src),
    }
}
