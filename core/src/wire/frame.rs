//! The two-frame envelope: `[b"__transfer__", json]`.

/// Frame 0 of every transfer message.
pub const TRANSFER_MAGIC: &[u8] = b"__transfer__";

/// True if `frames` is a transfer message: at least two frames, the first
/// exactly [`TRANSFER_MAGIC`]. Any other multipart (sglang's work items share
/// the sockets) is simply not one; this never fails.
pub fn is_transfer_frame<F: AsRef<[u8]>>(frames: &[F]) -> bool {
    transfer_payload(frames).is_some()
}

/// The JSON payload (frame 1) of a transfer message, or `None` if `frames`
/// is not one. Frames after the second are ignored, as the seed does.
pub fn transfer_payload<F: AsRef<[u8]>>(frames: &[F]) -> Option<&[u8]> {
    match frames {
        [magic, payload, ..] if magic.as_ref() == TRANSFER_MAGIC => Some(payload.as_ref()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_transfer_frames_from_others() {
        assert!(is_transfer_frame(&[TRANSFER_MAGIC, b"{}"]));
        assert!(is_transfer_frame(&[TRANSFER_MAGIC, b"{}", b"extra"]));
        assert!(!is_transfer_frame(&[TRANSFER_MAGIC]));
        assert!(!is_transfer_frame::<&[u8]>(&[]));
        assert!(!is_transfer_frame(&[&b"__transfer_"[..], b"{}"]));
        assert!(!is_transfer_frame(&[
            &b"{\"tensor_descriptors\": []}"[..],
            b"data"
        ]));
        assert_eq!(
            transfer_payload(&[TRANSFER_MAGIC, b"{\"a\":1}"]),
            Some(&b"{\"a\":1}"[..])
        );
    }
}
