//! The notification stream's frames: what a sender writes to a peer's
//! inbox and how the inbox cuts the stream back into them.
//!
//! A frame is a 4-byte little-endian body length, then the body. A body
//! is a kind byte and its payload: [`NAME`] (the sender's session id, sent
//! when a connection opens and again whenever it changes, since some data
//! planes name every registered region in it) or [`NOTE`] (a
//! notification). Under CURVE the body is sealed (see `seal`): the length
//! counts the sealed bytes.

use super::{MAX_FROM, MAX_NOTIFICATION};

/// A frame that names the sender: its session id, in UTF-8.
pub(super) const NAME: u8 = 0;
/// A frame that carries a notification.
pub(super) const NOTE: u8 = 1;

/// Bytes of a frame's length.
pub(super) const HEADER: usize = 4;

/// Bytes a seal adds to a body (ChaCha20-Poly1305's tag).
pub(super) const TAG: usize = 16;

/// The longest body an inbox takes: a name or a notification, sealed.
/// A longer one ends the connection: its sender is not a ferry engine.
pub(super) const MAX_BODY: usize = 1
    + TAG
    + if MAX_FROM > MAX_NOTIFICATION {
        MAX_FROM
    } else {
        MAX_NOTIFICATION
    };

/// Appends a frame's header for a body of `len` bytes.
pub(super) fn put_header(out: &mut Vec<u8>, len: usize) {
    // Bodies are at most MAX_BODY (about 16 KiB), which fits in 32 bits.
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

/// Why a stream is not a ferry engine's notifications.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TooLong(pub(super) usize);

/// Cuts whole frames from the front of `buf`: returns the body of the
/// first whole frame and the bytes it took, `None` while the frame is
/// still arriving.
pub(super) fn split(buf: &[u8]) -> Result<Option<(&[u8], usize)>, TooLong> {
    let Some(header) = buf.first_chunk::<HEADER>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*header) as usize;
    if len > MAX_BODY {
        return Err(TooLong(len));
    }
    Ok(buf
        .get(HEADER..HEADER + len)
        .map(|body| (body, HEADER + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_where_their_lengths_say() {
        let mut stream = Vec::new();
        for body in [&b"\x00engine-a"[..], b"\x01hello", b""] {
            put_header(&mut stream, body.len());
            stream.extend_from_slice(body);
        }
        let mut at = 0;
        let mut bodies = Vec::new();
        while let Some((body, used)) = split(&stream[at..]).unwrap() {
            bodies.push(body.to_vec());
            at += used;
        }
        assert_eq!(bodies, [&b"\x00engine-a"[..], b"\x01hello", b""]);
        assert_eq!(at, stream.len());
    }

    #[test]
    fn a_frame_still_arriving_is_not_cut() {
        let mut stream = Vec::new();
        put_header(&mut stream, 5);
        stream.extend_from_slice(b"\x01hel");
        assert_eq!(split(&stream), Ok(None));
        assert_eq!(split(&stream[..2]), Ok(None));
    }

    #[test]
    fn a_body_longer_than_any_notification_ends_the_stream() {
        let mut stream = Vec::new();
        put_header(&mut stream, MAX_BODY + 1);
        assert_eq!(split(&stream), Err(TooLong(MAX_BODY + 1)));
        let mut stream = Vec::new();
        put_header(&mut stream, MAX_BODY);
        assert_eq!(split(&stream), Ok(None));
    }
}
