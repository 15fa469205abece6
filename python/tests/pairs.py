"""What the engine tests share: byte patterns, their hashes, work in many
threads at once, and an engine in this process paired with a peer process
(tests/peer.py) that registered memory of its own."""

import hashlib
import threading
from typing import Callable, Iterable

import numpy as np

import tensorferry

MiB = 1 << 20


def in_threads(work: Callable[[int], None], args: Iterable[int]) -> None:
    """Runs ``work(arg)`` for each of ``args``, each in a thread of its
    own, all at once, and returns once every one has."""
    threads = [threading.Thread(target=work, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def pattern(n: int, seed: int) -> np.ndarray:
    """`n` bytes, the same for the same seed in every process."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def open_pair(backend, peer_factory, peer_size=24 * MiB, src_size=20 * MiB, torch_memory=False, **extra):
    """An engine here with `src_size` bytes of a pattern registered, and a
    peer with `peer_size` zeroed bytes registered: (engine, src, peer, the
    peer's buffer address, the peer's session id). `extra` options go to
    both engines."""
    name, options = backend
    options = {**options, **extra}
    eng = tensorferry.TransferEngine(name, **options)
    src = pattern(src_size, 1)
    eng.register_buffer(src.ctypes.data, src.nbytes)
    peer = peer_factory(name, options)
    got = peer.ask(op="alloc", name="pool", size=peer_size, torch=torch_memory)
    return eng, src, peer, got["addr"], got["session"]
