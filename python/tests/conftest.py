"""Fixtures: peer processes (tests/peer.py) on each backend, and the
environment the libfabric providers need on one host."""

import os
from pathlib import Path

import pytest

from procs import LineProcess

# tcp;ofi_rxm on loopback needs its interface named.
os.environ.setdefault("FI_TCP_IFACE", "lo")

#: Every backend the tests run on this host, as (id, backend, options).
BACKENDS = [
    ("local", "local", {}),
    ("fabric-tcp", "fabric", {"provider": "tcp;ofi_rxm", "write_timeout": 2.0}),
]


class Peer(LineProcess):
    """Another process with an engine of its own (tests/peer.py)."""

    def __init__(self, backend: str, options: dict) -> None:
        super().__init__("peer.py", {"backend": backend, "options": options})
        assert self.hello.get("ready"), self.hello

    def kill(self) -> None:
        super().kill()
        # libfabric's shm provider names its objects <pid>:...; a killed
        # process cannot remove its own.
        for leftover in Path("/dev/shm").glob(f"{self.proc.pid}:*"):
            leftover.unlink(missing_ok=True)


@pytest.fixture(params=BACKENDS, ids=[b[0] for b in BACKENDS])
def backend(request):
    """(backend, options) for each backend."""
    return request.param[1], request.param[2]


@pytest.fixture
def peer_factory():
    peers = []

    def make(backend: str, options: dict) -> Peer:
        p = Peer(backend, options)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
