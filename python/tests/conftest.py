"""Fixtures: peer processes (tests/peer.py) on each backend, and the
environment the libfabric providers need on one host."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# tcp;ofi_rxm on loopback needs its interface named.
os.environ.setdefault("FI_TCP_IFACE", "lo")

#: Every backend the tests run on this host, as (id, backend, options).
BACKENDS = [
    ("local", "local", {}),
    ("fabric-tcp", "fabric", {"provider": "tcp;ofi_rxm", "write_timeout": 2.0}),
    ("fabric-shm", "fabric", {"provider": "shm", "write_timeout": 2.0}),
]


class Peer:
    """Another process with an engine of its own."""

    def __init__(self, backend: str, options: dict) -> None:
        spec = json.dumps({"backend": backend, "options": options})
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._read()
        assert hello.get("ready"), hello

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer process ended (exit status {self.proc.wait()})")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        # libfabric's shm provider names its objects <pid>:...; a killed
        # process cannot remove its own.
        for leftover in Path("/dev/shm").glob(f"{self.proc.pid}:*"):
            leftover.unlink(missing_ok=True)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(op="exit")
            except (RuntimeError, BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except BrokenPipeError:
                pass


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
