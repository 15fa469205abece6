"""The connector's registered pool: anonymous memory registered with a
ferry engine once, carved into regions for payloads sent and received.

A received payload is handed out as zero-copy views of its region. Its
region returns to the pool when the last view is gone: the views' numpy
base holds a ``_Lease``, and the lease's finalizer gives the region back.
Finalizers may run in any thread, during any allocation (the garbage
collector runs them), so they only queue the region; the allocator takes
queued regions back under its lock at its next call.

Its pages are made from the start (``prefault``): a fresh anonymous page
costs a fault and zeroing on first touch, which made the first 64 MiB put
into a fresh pool 10 times as slow as the next. A thread makes them, by
``MADV_POPULATE_WRITE`` (Linux 5.14; called through ctypes, which lets go
of the GIL, as a pool of a GiB takes a quarter of a second to seconds on a
busy host), else by touching a byte of each page, while the connector
starts; a put or get meanwhile faults in only the pages not made yet."""

from __future__ import annotations

import bisect
import collections
import ctypes
import logging
import mmap
import threading
import time
from typing import Any, Deque, List, Optional, Tuple

import numpy as np

#: Regions start on page boundaries: tensors in them are aligned for any
#: dtype, and a data plane may register or pin whole pages.
REGION_ALIGN = 4096

# madvise(2)'s MADV_POPULATE_WRITE (Linux 5.14), which Python's mmap
# module names from 3.13 on.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)

logger = logging.getLogger("tensorferry.vllm_omni")


def align_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to`` (a power of two)."""
    return (n + to - 1) & ~(to - 1)


class _Lease:
    """Gives a region back to its pool when the last view of it is gone."""

    __slots__ = ("_pool", "_offset", "_size")

    def __init__(self, pool: "Pool", offset: int, size: int) -> None:
        self._pool = pool
        self._offset = offset
        self._size = size

    def __del__(self) -> None:
        self._pool.free_later(self._offset, self._size)


class LeasedArray(np.ndarray):
    """A numpy view of a pool region that keeps the region held: numpy views
    of it (and torch tensors made with ``torch.from_numpy``) keep it alive,
    and the region returns to the pool when the last of them is gone."""

    _ferry_lease: Optional[_Lease]

    def __array_finalize__(self, obj: Any) -> None:
        # Views of a view reach the lease through ``.base``; only the
        # first carries it.
        self._ferry_lease = None


class Pool:
    """``size`` bytes of anonymous memory registered with ``engine``,
    its pages made at once unless ``prefault`` is False (then each on its
    first use).

    ``alloc``/``free`` carve it into page-aligned regions (first fit,
    neighbours merged on free); ``lease`` hands a region to views that give
    it back when they are gone. Thread-safe."""

    def __init__(self, engine: Any, size: int, prefault: bool = True) -> None:
        if size <= 0:
            raise ValueError(f"pool_size must be positive, got {size}")
        self.size = align_up(size, REGION_ALIGN)
        self._map = mmap.mmap(-1, self.size)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        #: Seconds the pool's pages took to make: None until they are made,
        #: 0 without ``prefault``.
        self.prefault_seconds: Optional[float] = None if prefault else 0.0
        self.base: int = self.array.ctypes.data
        engine.register_buffer(self.base, self.size)
        if prefault:
            # The thread holds the map (and the array) until it is done.
            threading.Thread(target=self._prefault, name="ferry-omni-prefault", daemon=True).start()
        self._lock = threading.Lock()
        # Free regions as (offset, size), sorted by offset, never adjacent.
        self._free: List[Tuple[int, int]] = [(0, self.size)]
        self._returned: Deque[Tuple[int, int]] = collections.deque()
        self._used = 0

    @property
    def used(self) -> int:
        """Bytes held by regions (sent payloads not yet read, payloads being
        received, and received ones whose views are alive)."""
        with self._lock:
            self._take_returned()
            return self._used

    def alloc(self, size: int) -> Optional[int]:
        """The offset of a free region of at least ``size`` bytes, or None
        when no free region is that large."""
        need = align_up(max(size, 1), REGION_ALIGN)
        with self._lock:
            self._take_returned()
            for i, (offset, length) in enumerate(self._free):
                if length >= need:
                    if length == need:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + need, length - need)
                    self._used += need
                    return offset
        return None

    def free(self, offset: int, size: int) -> None:
        """Gives back the region ``alloc`` returned at ``offset`` for ``size``."""
        with self._lock:
            self._take_returned()
            self._give_back(offset, align_up(max(size, 1), REGION_ALIGN))

    def free_later(self, offset: int, size: int) -> None:
        """``free`` from a finalizer: queued (an atomic append, no lock),
        taken back at the pool's next call."""
        self._returned.append((offset, size))

    def lease(self, offset: int, size: int, span: Optional[int] = None) -> LeasedArray:
        """A uint8 view of the region at ``offset`` (``size`` bytes) that
        holds it: the region (``span`` bytes, if ``alloc`` was asked for
        more than the view) returns to the pool once the view and every
        view or tensor made from it are gone."""
        view = self.array[offset : offset + size].view(LeasedArray)
        view._ferry_lease = _Lease(self, offset, size if span is None else span)
        return view

    def _take_returned(self) -> None:
        while True:
            try:
                offset, size = self._returned.popleft()
            except IndexError:
                return
            self._give_back(offset, align_up(max(size, 1), REGION_ALIGN))

    def _give_back(self, offset: int, size: int) -> None:
        i = bisect.bisect_left(self._free, (offset, 0))
        if i < len(self._free) and self._free[i][0] < offset + size:
            raise RuntimeError(f"ferry pool: region {offset}+{size} freed twice")
        if i > 0 and sum(self._free[i - 1]) > offset:
            raise RuntimeError(f"ferry pool: region {offset}+{size} freed twice")
        self._used -= size
        start, end = offset, offset + size
        if i < len(self._free) and self._free[i][0] == end:
            end += self._free[i][1]
            del self._free[i]
        if i > 0 and sum(self._free[i - 1]) == start:
            start = self._free[i - 1][0]
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (start, end - start))

    def _prefault(self) -> None:
        start = time.perf_counter()
        try:
            # MADV_POPULATE_WRITE makes the pages without writing them. A
            # kernel without it (before 5.14) leaves them to first touch:
            # writing them from this thread instead would race the puts
            # and reads already using the pool.
            if _madvise(self.base, self.size, _MADV_POPULATE_WRITE) != 0:
                logger.info("FerryConnector: the kernel cannot make the pool's pages ahead (MADV_POPULATE_WRITE)")
        except Exception as e:  # the pages come on first touch, as without prefault
            logger.warning("FerryConnector: the pool's pages were not made ahead: %s", e)
        self.prefault_seconds = time.perf_counter() - start


def _madvise(addr: int, length: int, advice: int) -> int:
    """madvise(2) of ``length`` bytes at ``addr``, without the GIL: 0, or
    -1 where the kernel refuses it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return int(libc.madvise(addr, length, advice))
