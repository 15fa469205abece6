//! The pipeline's tensors: realistic shapes, contents derived from the
//! request number so that every byte can be checked downstream, and the
//! denoiser's deterministic transform.

use ferry_core::slots::{Dtype, TensorSpec};

/// Prompt embeddings: [1, 512, 4096] bf16 (4 MiB).
pub const PROMPT_SHAPE: [u64; 3] = [1, 512, 4096];
/// Video latents: [1, 16, 21, 90, 160] bf16 (about 9.2 MiB).
pub const LATENT_SHAPE: [u64; 5] = [1, 16, 21, 90, 160];

fn bytes(shape: &[u64], dtype: Dtype) -> u64 {
    shape.iter().product::<u64>() * dtype.size()
}

/// What the encoder sends: prompt embeddings and the initial latents.
pub fn encoder_tensors() -> [TensorSpec<'static>; 2] {
    [
        TensorSpec {
            field: "prompt_embeds",
            list_index: Some(0),
            shape: &PROMPT_SHAPE,
            dtype: Dtype::BFloat16,
            byte_len: bytes(&PROMPT_SHAPE, Dtype::BFloat16),
        },
        TensorSpec {
            field: "latents",
            list_index: None,
            shape: &LATENT_SHAPE,
            dtype: Dtype::BFloat16,
            byte_len: bytes(&LATENT_SHAPE, Dtype::BFloat16),
        },
    ]
}

/// What the denoiser sends: the denoised latents.
pub fn denoiser_tensors() -> [TensorSpec<'static>; 1] {
    [TensorSpec {
        field: "latents",
        list_index: None,
        shape: &LATENT_SHAPE,
        dtype: Dtype::BFloat16,
        byte_len: bytes(&LATENT_SHAPE, Dtype::BFloat16),
    }]
}

fn mix(mut z: u64) -> u64 {
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `i` of tensor `k` of request `n`, as the encoder makes it.
fn word(n: u64, k: u64, i: u64) -> u64 {
    mix((n << 40) ^ (k << 32) ^ i)
}

/// The denoiser's transform of word `i` of request `n`.
fn denoise(w: u64, n: u64, i: u64) -> u64 {
    w.rotate_left(7) ^ mix(n ^ 0xd15e_a5e0_0000_0000 ^ i)
}

/// Calls `f(i, word)` for each 8-byte word of `len` bytes (the tail of a
/// length that is not a multiple of 8 is the low bytes of one more word).
fn each_word(buf: &mut [u8], mut f: impl FnMut(u64) -> u64) {
    let mut chunks = buf.chunks_exact_mut(8);
    let mut i = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&f(i).to_le_bytes());
        i += 1;
    }
    let tail = chunks.into_remainder();
    let w = f(i).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&w[..n]);
}

/// Fills tensor `k` of request `n` as the encoder does.
pub fn fill(buf: &mut [u8], n: u64, k: u64) {
    each_word(buf, |i| word(n, k, i));
}

/// Writes the denoised latents of request `n`.
pub fn fill_denoised(buf: &mut [u8], n: u64) {
    each_word(buf, |i| denoise(word(n, 1, i), n, i));
}

/// Checks `got` against what `make` would write; returns the first byte
/// that differs.
fn first_mismatch(got: &[u8], make: impl Fn(u64) -> u64) -> Option<usize> {
    let mut chunks = got.chunks_exact(8);
    let mut i = 0u64;
    for c in &mut chunks {
        let want = make(i).to_le_bytes();
        if c != want {
            let j = c.iter().zip(want).position(|(a, b)| *a != b).unwrap_or(0);
            return Some(i as usize * 8 + j);
        }
        i += 1;
    }
    let tail = chunks.remainder();
    let want = make(i).to_le_bytes();
    tail.iter()
        .zip(want)
        .position(|(a, b)| *a != b)
        .map(|j| i as usize * 8 + j)
}

/// Checks tensor `k` of request `n` as the encoder made it.
pub fn check(got: &[u8], n: u64, k: u64) -> Option<usize> {
    first_mismatch(got, |i| word(n, k, i))
}

/// Checks the denoised latents of request `n`.
pub fn check_denoised(got: &[u8], n: u64) -> Option<usize> {
    first_mismatch(got, |i| denoise(word(n, 1, i), n, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_filled_checks_and_one_flipped_bit_is_found() {
        let mut b = vec![0u8; 1001];
        fill(&mut b, 7, 1);
        assert_eq!(check(&b, 7, 1), None);
        assert_eq!(check(&b, 8, 1), Some(0));
        b[1000] ^= 1;
        assert_eq!(check(&b, 7, 1), Some(1000));
        fill_denoised(&mut b, 7);
        assert_eq!(check_denoised(&b, 7), None);
        b[17] ^= 0x80;
        assert_eq!(check_denoised(&b, 7), Some(17));
    }
}
