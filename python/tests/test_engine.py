"""tensorferry.TransferEngine between two Python processes, on every backend:
bytes checked by hash in the receiving process, batches, threads, and each
failure returning a negative code with its reason."""

import subprocess
import sys
import time

import numpy as np
import pytest

import tensorferry
from pairs import MiB, in_threads, open_pair, sha
from procs import required_module


def test_single_writes_land_byte_for_byte(backend, peer_factory):
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    expect = np.zeros(24 * MiB, dtype=np.uint8)
    for off, dst, n in [(0, 0, 4096), (12345, 3 * MiB + 7, 16 * MiB + 3), (5, 24 * MiB - 1, 1)]:
        assert eng.transfer_sync(session, src.ctypes.data + off, base + dst, n) == 0, eng.last_error
        assert eng.last_error is None
        expect[dst:dst + n] = src[off:off + n]
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    eng.close()


def test_batches_land_byte_for_byte(backend, peer_factory):
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    rng = np.random.default_rng(7)
    expect = np.zeros(24 * MiB, dtype=np.uint8)
    srcs, dsts, lens = [], [], []
    at = 0
    for _ in range(200):
        n = int(rng.integers(1, 96 * 1024))
        off = int(rng.integers(0, src.nbytes - n))
        at += int(rng.integers(0, 4096))
        srcs.append(src.ctypes.data + off)
        dsts.append(base + at)
        lens.append(n)
        expect[at:at + n] = src[off:off + n]
        at += n
    assert eng.batch_transfer_sync(session, srcs, dsts, lens) == 0, eng.last_error
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    eng.close()


def test_both_processes_hand_tensors_to_each_other(backend, peer_factory):
    name, options = backend
    eng = tensorferry.TransferEngine(name, **options)
    mine = np.zeros(8 * MiB, dtype=np.uint8)
    eng.register_buffer(mine.ctypes.data, mine.nbytes)
    peer = peer_factory(name, options)
    peer.ask(op="alloc", name="out", size=8 * MiB)
    reply = peer.ask(op="write", name="out", seed=3, to=eng.session_id, offset=MiB, dst=mine.ctypes.data + 100, len=5 * MiB)
    assert reply["rc"] == 0, reply
    assert sha(mine[100:100 + 5 * MiB]) == reply["sha"]
    assert not mine[:100].any() and not mine[100 + 5 * MiB:].any()
    eng.close()


def test_many_threads_write_at_once(backend, peer_factory):
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    expect = np.zeros(24 * MiB, dtype=np.uint8)
    failures = []

    def worker(t: int) -> None:
        for i in range(20):
            n = 64 * 1024 + t * 1000 + i
            dst = (t * 20 + i) * 128 * 1024
            off = t * MiB + i * 4096
            rc = eng.transfer_sync(session, src.ctypes.data + off, base + dst, n)
            if rc != 0:
                failures.append((t, i, rc, eng.last_error))
            expect[dst:dst + n] = src[off:off + n]

    in_threads(worker, range(8))
    assert failures == []
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    eng.close()


def test_failures_return_negative_with_the_reason(backend, peer_factory):
    name, options = backend
    eng, src, peer, base, session = open_pair(backend, peer_factory, peer_size=MiB)
    codes = tensorferry.ERROR_CODES

    def fails(rc: int, code: str, *words: str) -> None:
        assert rc == codes[code], (rc, eng.last_error)
        text = eng.last_error or ""
        for w in words:
            assert w in text, text

    # A session id that names nothing.
    rc = eng.transfer_sync("nonsense", src.ctypes.data, base, 16)
    assert rc < 0 and "nonsense" in eng.last_error
    # A destination past the peer's registered memory.
    rc = eng.transfer_sync(session, src.ctypes.data, base + MiB - 8, 16)
    assert rc < 0 and eng.last_error
    # A source outside this engine's registered memory.
    other = np.ones(64, dtype=np.uint8)
    fails(eng.transfer_sync(session, other.ctypes.data, base, 64), "out_of_bounds", "outside every region this engine registered")
    # Lists of different lengths.
    fails(eng.batch_transfer_sync(session, [src.ctypes.data], [base, base], [1]), "io", "a batch of 1 sources, 2 destinations and 1 lengths")
    # Nothing landed.
    assert peer.ask(op="sha", name="pool")["sha"] == sha(np.zeros(MiB, dtype=np.uint8))
    # A success clears the reason.
    assert eng.transfer_sync(session, src.ctypes.data, base, 16) == 0
    assert eng.last_error is None
    # The peer dies.
    peer.kill()
    rc = eng.transfer_sync(session, src.ctypes.data, base, 4096)
    assert rc < 0 and eng.last_error, rc
    if name == "local":
        fails(rc, "peer_gone", "exited")
    eng.close()


def test_local_names_each_destination_failure(peer_factory):
    eng, src, peer, base, session = open_pair(("local", {}), peer_factory, peer_size=MiB)
    codes = tensorferry.ERROR_CODES
    assert eng.transfer_sync(session, src.ctypes.data, base + MiB - 8, 16) == codes["out_of_bounds"]
    assert "lies in none of peer" in eng.last_error
    garbled = session.replace("local:", "locl:")
    assert eng.transfer_sync(garbled, src.ctypes.data, base, 16) == codes["unknown_peer"]
    assert "is not a local session" in eng.last_error
    host, rest = session[len("local:"):].split(":", 1)
    elsewhere = "local:00ff." + host.split(".")[1] + ":" + rest
    assert eng.transfer_sync(elsewhere, src.ctypes.data, base, 16) == codes["unknown_peer"]
    assert "another host" in eng.last_error
    # Deregistered at the peer: refused, and nothing is written.
    assert peer.ask(op="deregister", name="pool")["ok"]
    assert eng.transfer_sync(session, src.ctypes.data, base, 16) == codes["out_of_bounds"]
    assert peer.ask(op="sha", name="pool")["sha"] == sha(np.zeros(MiB, dtype=np.uint8))
    # The peer closes its engine.
    peer.ask(op="exit")
    assert eng.transfer_sync(session, src.ctypes.data, base, 16) == codes["peer_gone"]
    eng.close()


def test_torch_tensors_are_registered_where_they_lie(peer_factory):
    torch = required_module("torch")
    eng = tensorferry.TransferEngine("local")
    t = torch.arange(0, 4 * MiB, dtype=torch.int32)
    eng.register_buffer(t.data_ptr(), t.numel() * t.element_size())
    peer = peer_factory("local", {})
    got = peer.ask(op="alloc", name="pool", size=16 * MiB, torch=True)
    assert eng.transfer_sync(got["session"], t.data_ptr(), got["addr"], 16 * MiB) == 0, eng.last_error
    assert peer.ask(op="sha", name="pool")["sha"] == sha(t.numpy().view(np.uint8))
    eng.close()


def test_a_threads_reason_is_its_own_and_ends_with_it():
    """Each thread reads only its own last failure, and the engine keeps
    nothing for threads that ended: many short-lived threads, each failing
    once, leave no table behind."""
    with tensorferry.TransferEngine("local") as eng:
        src = np.zeros(64, dtype=np.uint8)
        eng.register_buffer(src.ctypes.data, src.nbytes)
        native = eng._engine
        seen = []

        def fail_once(i: int) -> None:
            rc = eng.transfer_sync(f"nonsense-{i}", src.ctypes.data, 0, 16)
            seen.append((i, rc, eng.last_error))

        for wave in range(4):
            in_threads(fail_once, range(64 * wave, 64 * wave + 64))
        assert len(seen) == 256
        for i, rc, reason in seen:
            assert rc < 0 and f"nonsense-{i}" in (reason or ""), (i, rc, reason)
        assert eng.last_error is None
        # A thread's storage goes as its OS thread ends, which is just after
        # join() returns (CPython releases join before the thread exits).
        end = time.monotonic() + 30
        while native._last_error_holders and time.monotonic() < end:
            time.sleep(0.01)
        assert native._last_error_holders == 0
        # A live thread keeps its reason until its next success.
        assert eng.transfer_sync("nonsense", src.ctypes.data, 0, 16) < 0
        assert native._last_error_holders == 1 and "nonsense" in eng.last_error
        assert eng.transfer_sync(eng.session_id, src.ctypes.data, src.ctypes.data + 32, 16) == 0, eng.last_error
        assert native._last_error_holders == 0 and eng.last_error is None


def test_a_closed_engine_refuses_everything():
    with tensorferry.TransferEngine("local") as eng:
        a = np.zeros(4096, dtype=np.uint8)
        eng.register_buffer(a.ctypes.data, a.nbytes)
        with pytest.raises(tensorferry.FerryError, match="overlaps") as e:
            eng.register_buffer(a.ctypes.data + 8, 8)
        assert e.value.kind == "registration" and isinstance(e.value, tensorferry.RegistrationError)
        with pytest.raises(tensorferry.FerryError, match="no registered region starts there"):
            eng.deregister_buffer(a.ctypes.data + 1)
    with pytest.raises(tensorferry.FerryError, match="closed") as e:
        eng.register_buffer(a.ctypes.data, a.nbytes)
    assert isinstance(e.value, tensorferry.ClosedError) and e.value.kind == "closed"
    assert eng.transfer_sync("x", a.ctypes.data, 0, 1) < 0
    assert "closed" in eng.last_error


def test_bad_backends_and_options_are_named():
    with pytest.raises(TypeError, match='local data plane takes no option "bogus"'):
        tensorferry.TransferEngine("local", bogus=1)
    with pytest.raises(ValueError, match="backend \"carrier-pigeon\""):
        tensorferry.TransferEngine("carrier-pigeon")
    assert tensorferry.TransferEngine("auto").backend in ("local", "verbs")
    # "auto" takes the options of the plane it picks.
    auto = tensorferry.TransferEngine("auto")
    if auto.backend == "local":
        tensorferry.TransferEngine("auto", threads=2, split_at=1 << 20).close()
    auto.close()
    with pytest.raises(TypeError, match="option source: expected a string or a number, got NoneType"):
        tensorferry.TransferEngine("local", source=None)
    with pytest.raises(TypeError, match="option threads: expected a string or a number, got bool"):
        tensorferry.TransferEngine("local", threads=True)
    with pytest.warns(DeprecationWarning, match="split_at"):
        tensorferry.TransferEngine("local", parallel_min=1 << 20).close()
    assert tensorferry.TransferEngine("local").supports_gpu_direct is False


def test_verbs_without_a_device_fails_when_chosen():
    import tensorferry._native

    if "verbs" not in tensorferry._native.backends():
        pytest.skip("this build has no verbs backend")
    try:
        eng = tensorferry.TransferEngine("verbs")
    except tensorferry.FerryError as e:
        assert "RDMA device" in str(e)
    else:
        # A host with a NIC opens it.
        assert eng.backend == "verbs"
        eng.close()


def test_import_needs_no_libfabric():
    """The main module links no libfabric, and without the plugin the fabric
    backend fails when chosen, saying how to get it."""
    import tensorferry._native

    needed = subprocess.run(["readelf", "-d", tensorferry._native.__file__], capture_output=True, text=True, check=True).stdout
    assert "NEEDED" in needed and "libfabric" not in needed
    code = (
        "import sys; sys.modules['tensorferry_fabric'] = None; sys.modules['tensorferry_fabric._native'] = None\n"
        "import tensorferry\n"
        "assert 'fabric' not in tensorferry.backends(), tensorferry.backends()\n"
        "tensorferry.TransferEngine('local').close()\n"
        "try:\n"
        "    tensorferry.TransferEngine('fabric')\n"
        "except tensorferry.FerryError as e:\n"
        "    assert 'pip install tensorferry-fabric' in str(e), e\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"
