"""The exception ferry raises (both extension modules raise this class)."""

from __future__ import annotations


class FerryError(RuntimeError):
    """A ferry call failed; the message names what failed (the peer, the
    address, the call and its errno).

    ``kind`` says what kind of failure it is: ``"peer_gone"``,
    ``"unknown_peer"``, ``"out_of_bounds"``, ``"too_large"``, ``"timeout"``,
    ``"registration"`` or ``"io"``.
    """

    def __init__(self, message: str, kind: str = "io") -> None:
        super().__init__(message)
        self.kind = kind
