"""Shared by the interoperability scripts: the seed's own protocol module
(unmodified, from FERRY_SEED_DIR), and the pipeline's tensor contents as
ferry's pipeline makes them (src/pipeline/data.rs), so that either side can
check every byte the other wrote."""

import json
import os
import sys

import numpy as np

SEED_DIR = os.environ.get(
    "FERRY_SEED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "seed")
)
sys.path.insert(0, SEED_DIR)
import protocol as seed  # noqa: E402  (the seed, unmodified)

PROMPT_SHAPE = [1, 512, 4096]
LATENT_SHAPE = [1, 16, 21, 90, 160]
PROMPT_BYTES = 2 * 512 * 4096
LATENT_BYTES = 2 * 16 * 21 * 90 * 160
ALIGN = 512


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _mix(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def tensor(n, k, nbytes):
    """Tensor k of request n, as ferry's encoder fills it."""
    i = np.arange(nbytes // 8, dtype=np.uint64)
    return _mix(np.uint64((n << 40) ^ (k << 32)) ^ i).tobytes()


def denoised(n):
    """The latents of request n after ferry's denoiser transform."""
    i = np.arange(LATENT_BYTES // 8, dtype=np.uint64)
    w = _mix(np.uint64((n << 40) ^ (1 << 32)) ^ i)
    with np.errstate(over="ignore"):
        rot = (w << np.uint64(7)) | (w >> np.uint64(57))
        return (rot ^ _mix(np.uint64(n ^ 0xD15EA5E000000000) ^ i)).tobytes()


def emit(**kv):
    print(json.dumps(kv), flush=True)
