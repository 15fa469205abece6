//! The control-plane codec workload shared by `ferry bench wire` and
//! `cargo bench`: the same messages the seed's Python is timed on
//! (`bench/python/wire_seed.py`), encoded and decoded in a loop.

use std::time::{Duration, Instant};

use tensorferry_core::json::JsonStr;
use tensorferry_core::wire::{
    decode, DecodeError, Manifest, Msg, Push, Shape, Staged, TensorEntry,
};

/// The four tensors of a typical text-to-video hand-off, laid out at
/// 512-byte-aligned offsets, as in `bench/python/wire_seed.py`.
pub const STAGED_TENSORS: [TensorEntry<'static>; 4] = [
    TensorEntry {
        field: JsonStr::plain("prompt_embeds"),
        list_index: None,
        offset: 0,
        shape: Shape::Dims(&[1, 512, 4096]),
        dtype: JsonStr::plain("bfloat16"),
    },
    TensorEntry {
        field: JsonStr::plain("pooled_prompt_embeds"),
        list_index: None,
        offset: 4_194_304,
        shape: Shape::Dims(&[1, 4096]),
        dtype: JsonStr::plain("bfloat16"),
    },
    TensorEntry {
        field: JsonStr::plain("latents"),
        list_index: Some(0),
        offset: 4_202_496,
        shape: Shape::Dims(&[1, 16, 21, 90, 160]),
        dtype: JsonStr::plain("bfloat16"),
    },
    TensorEntry {
        field: JsonStr::plain("timesteps"),
        list_index: None,
        offset: 14_088_192,
        shape: Shape::Dims(&[1]),
        dtype: JsonStr::plain("float32"),
    },
];

/// A `transfer_staged` with the four-tensor manifest.
pub fn staged_msg() -> Msg<'static> {
    Msg::Staged(Staged {
        request_id: JsonStr::plain("req-000042-3f9c2a7e"),
        data_size: 14_088_704,
        manifest: Manifest::Entries(&STAGED_TENSORS),
        session_id: JsonStr::plain("10.0.0.7:5557/mlx5_0"),
        pool_ptr: 140_245_832_663_040,
        slot_offset: 268_435_456,
        ..Staged::default()
    })
}

/// A `transfer_push`.
pub fn push_msg() -> Msg<'static> {
    Msg::Push(Push {
        request_id: JsonStr::plain("req-000042-3f9c2a7e"),
        dest_session_id: JsonStr::plain("10.0.0.9:5557/mlx5_1"),
        dest_addr: 139_912_345_698_304,
        transfer_size: 14_088_704,
    })
}

/// One encode into `buf` and one decode of the result: what the seed's
/// `encode_transfer_msg` + `decode_transfer_msg` do. Returns the payload
/// length.
pub fn encode_decode(msg: &Msg<'_>, buf: &mut [u8]) -> Result<usize, DecodeError> {
    let n = msg.encode(buf).unwrap_or(0);
    std::hint::black_box(decode(&buf[..n])?);
    Ok(n)
}

/// [`encode_decode`], then a walk of the decoded manifest with every entry
/// type-checked: what a receiver does before it touches the tensors.
pub fn encode_decode_walk(msg: &Msg<'_>, buf: &mut [u8]) -> Result<usize, DecodeError> {
    let n = msg.encode(buf).unwrap_or(0);
    match decode(&buf[..n])? {
        Msg::Staged(m) => {
            std::hint::black_box(m.manifest.validate()?);
        }
        Msg::Ready(m) => {
            std::hint::black_box(m.manifest.validate()?);
        }
        other => {
            std::hint::black_box(other);
        }
    }
    Ok(n)
}

/// Result of timing one workload.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// Encode+decode round trips performed.
    pub iterations: u64,
    /// Wall time they took.
    pub elapsed: Duration,
    /// Payload size in bytes.
    pub payload_len: usize,
}

impl Rate {
    /// Encode+decode pairs per second.
    pub fn per_second(&self) -> f64 {
        self.iterations as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `work(msg)` repeatedly for about `duration`.
pub fn measure(
    msg: &Msg<'_>,
    work: fn(&Msg<'_>, &mut [u8]) -> Result<usize, DecodeError>,
    duration: Duration,
) -> Result<Rate, DecodeError> {
    let mut buf = vec![0u8; msg.encoded_len(Default::default())];
    let start = Instant::now();
    let mut iterations = 0u64;
    let mut payload_len = 0;
    while start.elapsed() < duration {
        for _ in 0..1024 {
            payload_len = work(std::hint::black_box(msg), &mut buf)?;
        }
        iterations += 1024;
    }
    Ok(Rate {
        iterations,
        elapsed: start.elapsed(),
        payload_len,
    })
}

/// The floor a codec is set beside: a plain `memcpy` of a payload's
/// bytes, as often as it fits in about `duration`.
pub fn copy_floor(payload_len: usize, duration: Duration) -> Rate {
    let from = vec![7u8; payload_len];
    let mut to = vec![0u8; payload_len];
    let start = Instant::now();
    let mut iterations = 0u64;
    while start.elapsed() < duration {
        for _ in 0..1024 {
            to.copy_from_slice(std::hint::black_box(&from));
            std::hint::black_box(&mut to);
        }
        iterations += 1024;
    }
    Rate {
        iterations,
        elapsed: start.elapsed(),
        payload_len,
    }
}
