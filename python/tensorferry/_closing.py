"""``with`` support for ferry's nodes: an instance, a coordinator."""

from __future__ import annotations

from typing import Any, Self


class Closing:
    """Closed on leaving a ``with`` block, however the block ends:
    ``__enter__`` gives the object itself, ``__exit__`` calls its
    ``close()``."""

    __slots__ = ()

    def close(self) -> None:
        """Stops it; each class says what that frees."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
