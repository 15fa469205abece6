//! The pipeline's tensors: realistic shapes, contents derived from the
//! request number so that every byte can be checked downstream, and the
//! denoiser's deterministic transform.

use tensorferry_core::slots::{Dtype, TensorSpec};

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

/// The random workload's one tensor: `dims[0]` bytes of `uint8`.
pub use tensorferry_bench::blob;

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

/// The size of request `n` of the random workload: request 0 is 1 byte,
/// request 1 is `max` bytes; of the rest, one in 128 is uniform in
/// `[max/8, max]` and the others log-uniform in `[1, min(max, 16 MiB)]`, so
/// that thousands of transfers cover every size class without moving
/// terabytes.
pub fn random_size(seed: u64, n: u64, max: u64) -> u64 {
    let max = max.max(1);
    match n {
        0 => return 1,
        1 => return max,
        _ => {}
    }
    let r = mix(seed ^ mix(n));
    if r % 128 == 0 {
        let lo = (max / 8).max(1);
        return lo + mix(r) % (max - lo + 1);
    }
    let small = max.min(16 << 20);
    let bits = 64 - small.leading_zeros() as u64;
    let b = 1 + mix(r ^ 1) % bits;
    let lo = 1u64 << (b - 1);
    let hi = ((1u128 << b) - 1).min(u128::from(small)) as u64;
    lo + mix(r ^ 2) % (hi - lo + 1)
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
    fn random_sizes_span_one_byte_to_the_maximum() {
        let max = 256 << 20;
        let sizes: Vec<u64> = (0..4000).map(|n| random_size(7, n, max)).collect();
        assert_eq!(sizes[0], 1);
        assert_eq!(sizes[1], max);
        assert!(sizes.iter().all(|&s| (1..=max).contains(&s)));
        let large = sizes.iter().filter(|&&s| s > 16 << 20).count();
        assert!((10..100).contains(&large), "{large} large");
        let tiny = sizes.iter().filter(|&&s| s < 4096).count();
        assert!(tiny > 1000, "{tiny} below 4 KiB");
        assert_eq!(random_size(7, 5, 1), 1);
        assert_eq!(random_size(7, 3, 100), random_size(7, 3, 100));
    }

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
