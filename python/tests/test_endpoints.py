"""Every socket a transfer engine's process listens on is one the book's
endpoint table names (docs/src/operating.md, "Endpoints the processes
open"), read from /proc, and at each a stranger is refused: at the
notification inbox a stranger speaking its stream without a key, from an
address on the allow-list and from one outside it, none delivered (the
strangers with keys, which need a Noise handshake this environment has no
library for, are tests/engine_api/inbox_guard.rs's); at libfabric's own
listener, writes and reads under guessed memory keys, none reaching the
peer's memory. Meanwhile the engines' own transfer and notification
arrive byte-exact. The verbs stand-in's side channels are
tests/endpoints_verbs.rs's (the stand-in lives in one process); the
nodes' cli/tests/endpoints.rs's; FerryConnector's claim socket
test_vllm_omni_guard.py's (it runs in vLLM-omni's environment)."""

import hashlib
import os
import re
import socket
import stat
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

import tensorferry
from conftest import Peer

BOOK = Path(__file__).resolve().parents[2] / "docs" / "src" / "operating.md"
MiB = 1 << 20


def book() -> set:
    """The book's endpoint table: (process, endpoint) of each row."""
    table = BOOK.read_text().split("### Endpoints the processes open", 1)[1]
    rows = set()
    started = False
    for line in table.splitlines():
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.split("|")]
        names = [re.search(r"`([^`]+)`", c) for c in cells[1:3]]
        if all(names):
            rows.add((names[0].group(1), names[1].group(1)))
    assert len(rows) >= 10, rows
    return rows


def listening(pid: int) -> list:
    """The TCP ports (and unix paths) process `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    ports = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[9]) in inodes:
                ports.append(int(f[1].split(":")[1], 16))
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        if len(f) >= 7 and int(f[3], 16) & 0x10000 and int(f[6]) in inodes:
            ports.append(f[7] if len(f) > 7 else "<unnamed unix socket>")
    return ports


def inbox_of(session: str) -> tuple:
    """(endpoint, server key) of an engine's session id: after the `|`,
    `<40-character key>@tcp://...` under CURVE (Z85 has `@` among its
    letters, so the key is taken by its length)."""
    part = session.rsplit("|", 1)[1]
    if len(part) > 41 and part[40] == "@":
        return part[41:], part[:40]
    return part, None


def fabric_port(session: str) -> int:
    """The port of a libfabric tcp session id's address (a sockaddr_in in
    hex: family, then the port in network order)."""
    addr = bytes.fromhex(session.split("|")[0].split(":")[2])
    return int.from_bytes(addr[2:4], "big")


def keys(tmp: Path, *names: str) -> dict:
    """A key pair for each name (pyzmq's certificates, secret files made
    the owner's alone): name -> (public, secret) certificate paths."""
    out = {}
    for name in names:
        d = tmp / name
        d.mkdir()
        public, secret = zmq.auth.create_certificates(str(d), name)
        os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)
        out[name] = (Path(public), Path(secret))
    return out


def stranger(inbox: str, source: str, claimed: str) -> socket.socket:
    """A TCP connection to `inbox` from `source` that speaks the inbox's
    stream without a key: the sender's name `claimed`, then notifications
    (each frame a 4-byte little-endian length, a kind byte and its
    payload; docs/design.md)."""
    host, port = inbox.removeprefix("tcp://").rsplit(":", 1)
    s = socket.socket()
    s.bind((source, 0))
    s.connect((host, int(port)))
    s.setblocking(False)
    name = b"\x00" + claimed.encode()
    s.send(struct.pack("<I", len(name)) + name)
    return s


def forge(s: socket.socket) -> None:
    """One notification on a stranger's connection, if it still takes it."""
    note = b"\x01done:forged"
    try:
        s.send(struct.pack("<I", len(note)) + note)
    except OSError:
        pass


BACKENDS = [
    ("local", "local", {}),
    ("fabric-tcp", "fabric", {"provider": "tcp;ofi_rxm", "write_timeout": 2.0, "source": "127.0.0.1"}),
]


@pytest.mark.parametrize("name,backend,options", BACKENDS, ids=[b[0] for b in BACKENDS])
def test_strangers_are_refused_at_every_endpoint_an_engine_opens(tmp_path, peer_factory, name, backend, options):
    rows = book()
    k = keys(tmp_path, "a", "b", "other")
    guard_of = lambda me, peer: {  # noqa: E731
        "allow_from": "127.0.0.1",
        "curve_key": str(k[me][1]),
        "curve_peers": str(k[peer][0]),
        "notify_host": "127.0.0.1",
    }
    b = peer_factory(backend, {**options, **guard_of("b", "a")})
    b.tell(op="alloc", name="pool", size=4 * MiB, fill=0x5A)
    b_session = b.read()["session"]
    a = tensorferry.TransferEngine(backend, **options, **guard_of("a", "b"))
    try:
        # What b's process listens on is what the book names.
        inbox, server = inbox_of(b_session)
        assert server, b_session
        known = {
            int(inbox.rsplit(":", 1)[1]): "inbox",
            f"@tensorferry-notify/{inbox.removeprefix('tcp://')}": "inbox-local",
        }
        if backend == "fabric":
            known[fabric_port(b_session)] = "fabric"
        for port in listening(b.proc.pid):
            assert port in known, f"b listens on {port!r}, which the book's endpoint table does not name"
            assert ("TransferEngine", known[port]) in rows, known[port]
        assert set(known) <= set(listening(b.proc.pid)), (known, listening(b.proc.pid))

        # Strangers at b's inbox, claiming to be a, without a key: from an
        # allowed address and from one outside the allow-list.
        a_session = a.session_id
        sockets = [stranger(inbox, source, a_session) for source in ("127.0.0.1", "127.0.0.2")]
        for _ in range(20):
            for s in sockets:
                forge(s)
            time.sleep(0.02)

        # At libfabric's own listener: another engine with no key of b's
        # writes and reads under guessed memory keys; none reaches b's pool.
        if backend == "fabric":
            c = tensorferry.TransferEngine(backend, **options, allow_from="127.0.0.1")
            try:
                probe = np.full(4096, 0xEE, dtype=np.uint8)
                c.register_buffer(probe.ctypes.data, probe.nbytes)
                plane = b_session.split("|")[0]
                fields = plane.split(":")
                region = fields[3].split(",")[0].split(".")
                base = int(region[1], 16)
                for guess in ("1", "2", "3", "123456789abcdef0", "ffffffffffffffff"):
                    fields_g = list(fields)
                    fields_g[3] = ".".join([guess] + region[1:])
                    forged = ":".join(fields_g)
                    assert c.transfer_sync(forged, probe.ctypes.data, base, 4096) < 0, guess
                    assert c.read_sync(forged, probe.ctypes.data, base, 4096) < 0, guess
                assert (probe == 0xEE).all(), "a byte of b's pool was read"
            finally:
                c.close()

        # a's own transfer and notification arrive, and only they.
        src = np.arange(2 * MiB, dtype=np.uint64).view(np.uint8)[: 2 * MiB].copy()
        a.register_buffer(src.ctypes.data, src.nbytes)
        b.tell(op="alloc", name="dst", size=2 * MiB)
        dst = b.read()
        # Its session id names the new region too (libfabric's name each).
        t = a.post_write(dst["session"], [src.ctypes.data], [dst["addr"]], [src.nbytes], notify=b"done:real")
        assert t.wait(30) is True
        t.release()
        b.tell(op="watch", n=2, seconds=3)
        got = b.read()["got"]
        assert [(s, bytes.fromhex(m)) for s, m, _ in got] == [(a.session_id, b"done:real")], got
        b.tell(op="sha", name="dst")
        assert b.read()["sha"] == hashlib.sha256(src.tobytes()).hexdigest()
        b.tell(op="sha", name="pool")
        assert b.read()["sha"] == hashlib.sha256(bytes([0x5A]) * (4 * MiB)).hexdigest()
        for s in sockets:
            s.close()
    finally:
        a.close()
