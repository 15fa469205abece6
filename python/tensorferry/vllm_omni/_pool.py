"""The connector's registered pool: anonymous memory registered with a
ferry engine once, carved into regions for payloads sent and received.

A received payload is handed out as zero-copy views of its region. Its
region returns to the pool when the last view is gone: the views' numpy
base holds a ``_Lease``, and the lease's finalizer gives the region back.
Finalizers may run in any thread, during any allocation (the garbage
collector runs them), so they only queue the region; the allocator takes
queued regions back under its lock at its next call."""

from __future__ import annotations

import bisect
import collections
import mmap
import threading
from typing import Any, Deque, List, Optional, Tuple

import numpy as np

#: Regions start on page boundaries: tensors in them are aligned for any
#: dtype, and a data plane may register or pin whole pages.
REGION_ALIGN = 4096


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
    """``size`` bytes of anonymous memory registered with ``engine``.

    ``alloc``/``free`` carve it into page-aligned regions (first fit,
    neighbours merged on free); ``lease`` hands a region to views that give
    it back when they are gone. Thread-safe."""

    def __init__(self, engine: Any, size: int) -> None:
        if size <= 0:
            raise ValueError(f"pool_size must be positive, got {size}")
        self.size = align_up(size, REGION_ALIGN)
        self._map = mmap.mmap(-1, self.size)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.base: int = self.array.ctypes.data
        engine.register_buffer(self.base, self.size)
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

    def lease(self, offset: int, size: int) -> LeasedArray:
        """A uint8 view of the region at ``offset`` (``size`` bytes) that
        holds it: the region returns to the pool once the view and every
        view or tensor made from it are gone."""
        view = self.array[offset : offset + size].view(LeasedArray)
        view._ferry_lease = _Lease(self, offset, size)
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
