"""tensorferry.TransferEngine's transfers by handle, reads and notifications,
between two Python processes on every backend: handles posted from many
threads, their states and waits, releasing and timing out, notifications
checked against the receiver's memory the moment they arrive and in order
per sender, and one-sided reads of the peer's bytes."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import tensorferry
from pairs import MiB, in_threads, open_pair, pattern, sha

#: The fabric backends with their data plane's own write timeout out of
#: the way, so that the engine's (the call's) is what ends a transfer.
PATIENT = {"write_timeout": 600.0}


def settle(transfers, seconds=120):
    """Polls every transfer's state until none is pending (a guard against
    a hang, not a timing assertion); returns their states."""
    end = time.monotonic() + seconds
    while True:
        states = [t.state for t in transfers]
        if "pending" not in states or time.monotonic() > end:
            return states


def stop(pid: int) -> None:
    """Stops a process and returns once every one of its threads is stopped:
    kill() only marks the stop, and on a loaded machine a thread of the
    peer's may still run for a while (long enough to place a write)."""
    os.kill(pid, signal.SIGSTOP)
    end = time.monotonic() + 60
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    # The state follows the command's closing parenthesis.
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        if all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < end, f"process {pid} did not stop: {states}"
        time.sleep(0.001)


def note(i: int, off: int, data: np.ndarray) -> bytes:
    """A notification naming where `data` was written, for the peer to
    check its memory against when the notification arrives."""
    return json.dumps({"i": i, "off": off, "len": int(data.nbytes), "sha": sha(data)}).encode()


def test_handles_from_many_threads_land_byte_for_byte(backend, peer_factory):
    """Four threads each post eight transfers of eight writes without
    waiting, then poll their states until all are done; every byte is at
    the peer."""
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    expect = np.zeros(24 * MiB, dtype=np.uint8)
    handles = {}
    errors = []

    def worker(t: int) -> None:
        rng = np.random.default_rng(100 + t)
        mine = []
        try:
            for k in range(8):
                srcs, dsts, lens = [], [], []
                for j in range(8):
                    n = int(rng.integers(1, 64 * 1024))
                    off = int(rng.integers(0, src.nbytes - n))
                    dst = ((t * 8 + k) * 8 + j) * 80 * 1024
                    srcs.append(src.ctypes.data + off)
                    dsts.append(base + dst)
                    lens.append(n)
                    expect[dst:dst + n] = src[off:off + n]
                mine.append(eng.post_write(session, srcs, dsts, lens))
            handles[t] = mine
        except Exception as e:  # reported by the main thread
            errors.append(e)

    in_threads(worker, range(4))
    assert errors == []
    every = [h for t in sorted(handles) for h in handles[t]]
    assert len(every) == 32
    assert settle(every) == ["done"] * 32
    for h in every:
        assert h.wait(0) is True
        h.release()
        assert h.state == "done"
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    eng.close()


def test_wait_returns_once_done_and_release_is_idempotent(backend, peer_factory):
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    t = eng.post_write(session, [src.ctypes.data], [base], [16 * MiB], timeout=120)
    assert isinstance(t, tensorferry.Transfer)
    assert t.wait() is True
    assert t.state == "done" and "done" in repr(t) and "write" in repr(t)
    t.release()
    t.release()
    assert t.state == "done" and t.wait(0) is True
    # A `with` block releases it; what it waited for is there.
    with eng.post_write(session, [src.ctypes.data + 5], [base + 16 * MiB], [MiB], timeout=120) as t2:
        assert t2.wait(timeout=120) is True
    assert t2.state == "done"
    expect = np.zeros(24 * MiB, dtype=np.uint8)
    expect[:16 * MiB] = src[:16 * MiB]
    expect[16 * MiB:17 * MiB] = src[5:5 + MiB]
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    eng.close()


def test_post_refusals_raise_by_kind(peer_factory):
    eng, src, peer, base, session = open_pair(("local", {}), peer_factory, peer_size=MiB)
    other = np.ones(64, dtype=np.uint8)
    with pytest.raises(tensorferry.OutOfBoundsError, match="outside every region this engine registered"):
        eng.post_write(session, [other.ctypes.data], [base], [64])
    with pytest.raises(tensorferry.FerryIOError, match="a batch of 2 sources, 1 destinations and 1 lengths"):
        eng.post_write(session, [src.ctypes.data, src.ctypes.data], [base], [1])
    with pytest.raises(tensorferry.OutOfBoundsError, match="read of 64 bytes into"):
        eng.post_read(session, [other.ctypes.data], [base], [64])
    assert eng.read_sync(session, other.ctypes.data, base, 64) == tensorferry.ERROR_CODES["out_of_bounds"]
    assert "read of 64 bytes into" in eng.last_error
    with pytest.raises(ValueError, match="timeout"):
        eng.post_write(session, [src.ctypes.data], [base], [64], timeout=-1)
    # Nothing moved.
    assert peer.ask(op="sha", name="pool")["sha"] == sha(np.zeros(MiB, dtype=np.uint8))
    eng.close()
    with pytest.raises(tensorferry.ClosedError):
        eng.post_write(session, [src.ctypes.data], [base], [64])
    with pytest.raises(tensorferry.ClosedError):
        eng.notify(session, b"x")
    with pytest.raises(tensorferry.ClosedError):
        eng.notifications()


def test_a_failed_transfer_raises_from_wait(peer_factory):
    eng, src, peer, base, session = open_pair(("local", {}), peer_factory, peer_size=MiB)
    # A destination past the peer's registered memory: the local data
    # plane refuses it when it makes the write.
    try:
        t = eng.post_write(session, [src.ctypes.data], [base + MiB - 8], [16])
    except tensorferry.OutOfBoundsError:
        pass
    else:
        with pytest.raises(tensorferry.OutOfBoundsError):
            t.wait()
        assert t.state == "failed"
        t.release()
        assert t.state == "failed"
        with pytest.raises(tensorferry.OutOfBoundsError):
            t.wait(0)
    peer.kill()
    with pytest.raises(tensorferry.PeerGoneError):
        eng.post_write(session, [src.ctypes.data], [base], [16]).wait()
    eng.close()


@pytest.mark.parametrize("backend_id", ["fabric-tcp"])
def test_a_stalled_transfer_waits_times_out_releases_and_closes(backend_id, peer_factory):
    """Against a stopped peer (tcp;ofi_rxm completes a delivery-complete
    write only once the target's provider has placed it) a transfer stays
    pending (the shm provider's post itself waits for a stopped peer, so it
    cannot be used here): wait(timeout) says so,
    release ends it, its own timeout fails it, closing the engine ends it,
    and a thread blocked in wait() holds neither the GIL nor a release."""
    from conftest import BACKENDS

    name, options = next((b[1], b[2]) for b in BACKENDS if b[0] == backend_id)
    backend = (name, {**options, **PATIENT})
    eng, src, peer, base, session = open_pair(backend, peer_factory, peer_size=8 * MiB)
    assert eng.transfer_sync(session, src.ctypes.data, base, 4096) == 0, eng.last_error
    stop(peer.proc.pid)
    try:
        t = eng.post_write(session, [src.ctypes.data], [base], [4 * MiB], timeout=600)
        assert t.state == "pending"
        assert t.wait(0) is False
        assert t.wait(timeout=0.2) is False
        assert "pending" in repr(t)
        # A waiter in another thread: this thread runs (the GIL is free)
        # and its release ends the transfer before the transfer's own
        # timeout would, so the waiter sees the release, not a timeout.
        seen = []
        waiting = threading.Event()

        def wait_in_thread() -> None:
            waiting.set()
            seen.append(_outcome(t))

        waiter = threading.Thread(target=wait_in_thread)
        waiter.start()
        assert waiting.wait(60)
        assert t.wait(timeout=0.2) is False
        t.release()
        waiter.join()
        assert seen == [("closed", "released before it finished")], seen
        assert t.state == "failed"
        with pytest.raises(tensorferry.ClosedError, match="released before it finished"):
            t.wait()
        t.release()

        # Its own timeout.
        t = eng.post_write(session, [src.ctypes.data], [base], [4 * MiB], timeout=0.3)
        with pytest.raises(tensorferry.FerryTimeoutError) as e:
            t.wait()
        assert e.value.kind == "timeout" and t.state == "failed"
        t.release()

        # The engine closes under a pending transfer.
        t = eng.post_write(session, [src.ctypes.data], [base], [4 * MiB], timeout=600)
        assert t.wait(0) is False
        eng.close()
        assert t.state == "failed"
        with pytest.raises(tensorferry.ClosedError, match="its engine was closed"):
            t.wait()
    finally:
        os.kill(peer.proc.pid, signal.SIGCONT)
    assert peer.ask(op="session")["session"] == session


def _outcome(t):
    try:
        return ("returned", t.wait())
    except tensorferry.FerryError as e:
        return (e.kind, "released before it finished" if "released before it finished" in str(e) else str(e))


def test_attached_notifications_come_after_the_bytes_in_order(backend, peer_factory):
    """The peer checks its memory the moment each notification arrives:
    every attached one finds its transfer's bytes there. A sender's
    notifications, attached or sent alone, arrive in the order it sent
    them."""
    eng, src, peer, base, session = open_pair(backend, peer_factory)
    peer.tell(op="watch", n=40, seconds=120)
    sent = []
    # In turn: a transfer with a notification, then one sent alone.
    for i in range(16):
        off = i * MiB
        data = src[i * 4096:i * 4096 + MiB]
        message = note(i, off, data)
        t = eng.post_write(session, [data.ctypes.data], [base + off], [data.nbytes], notify=message)
        assert t.wait(120) is True
        t.release()
        alone = f"alone {i}".encode()
        eng.notify(session, alone)
        sent += [message, alone]
    # Eight in flight at once (their order is their completions').
    flight = []
    for i in range(16, 24):
        off = i * MiB
        data = src[i * 8192:i * 8192 + MiB]
        flight.append(eng.post_write(session, [data.ctypes.data], [base + off], [data.nbytes], notify=note(i, off, data)))
    assert [t.wait(120) for t in flight] == [True] * 8
    got = peer.read()["got"]
    assert len(got) == 40, got
    assert {g[0] for g in got} == {eng.session_id}
    assert [bytes.fromhex(g[1]) for g in got[:32]] == sent
    checks = [g[2] for g in got if g[2] is not None]
    assert checks == [True] * 24, got
    assert sorted(json.loads(bytes.fromhex(g[1]))["i"] for g in got[32:]) == list(range(16, 24))
    eng.close()


def test_notifications_alone_both_ways(backend, peer_factory):
    """Standalone notifications each way, up to the longest, in order, each
    naming its sender; reading them does not wait."""
    eng, src, peer, base, session = open_pair(backend, peer_factory, peer_size=MiB)
    assert eng.notifications() == []
    assert tensorferry.MAX_NOTIFICATION == 4096
    longest = bytes(pattern(tensorferry.MAX_NOTIFICATION, 9))
    out = [f"to the peer {i}".encode() for i in range(100)] + [longest, b""]
    peer.tell(op="watch", n=len(out), seconds=120)
    for m in out:
        eng.notify(session, m)
    got = peer.read()["got"]
    assert [bytes.fromhex(g[1]) for g in got] == out
    assert {g[0] for g in got} == {eng.session_id}

    back = [f"from the peer {i}".encode() for i in range(100)] + [longest]
    assert peer.ask(op="notify", to=eng.session_id, messages=[m.hex() for m in back])["ok"]
    received = []
    end = time.monotonic() + 120
    while len(received) < len(back) and time.monotonic() < end:
        received += eng.notifications()
    assert [m for _, m in received] == back
    assert {s for s, _ in received} == {session}
    assert all(isinstance(m, bytes) for _, m in received)
    eng.close()


def test_notification_limits_and_sessions_without_an_inbox(peer_factory):
    eng, src, peer, base, session = open_pair(("local", {}), peer_factory, peer_size=MiB)
    too_long = b"x" * (tensorferry.MAX_NOTIFICATION + 1)
    with pytest.raises(tensorferry.TooLargeError, match="4097 bytes; the most is 4096"):
        eng.notify(session, too_long)
    with pytest.raises(tensorferry.TooLargeError):
        eng.post_write(session, [src.ctypes.data], [base], [64], notify=too_long)
    # A data plane's session id alone (a ferry node's has no inbox):
    # transfers reach it, notifications do not.
    assert "|tcp://" in session
    bare = session.rsplit("|", 1)[0]
    with pytest.raises(tensorferry.UnknownPeerError, match="names no notification endpoint"):
        eng.notify(bare, b"hello")
    with pytest.raises(tensorferry.UnknownPeerError, match="names no notification endpoint"):
        eng.post_write(bare, [src.ctypes.data], [base], [64], notify=b"hello")
    # Refused whole: nothing was written.
    assert peer.ask(op="sha", name="pool")["sha"] == sha(np.zeros(MiB, dtype=np.uint8))
    assert eng.post_write(bare, [src.ctypes.data], [base], [64]).wait(120) is True
    expect = np.zeros(MiB, dtype=np.uint8)
    expect[:64] = src[:64]
    assert peer.ask(op="sha", name="pool")["sha"] == sha(expect)
    with pytest.raises(TypeError):
        eng.notify(session, "text is not bytes")
    eng.close()


def test_notify_host_names_the_inbox():
    with tensorferry.TransferEngine("local", notify_host="127.0.0.1") as eng:
        assert eng.session_id.rsplit("|", 1)[1].startswith("tcp://127.0.0.1:")
    with pytest.raises(tensorferry.FerryError, match="bind the notification inbox"):
        tensorferry.TransferEngine("local", notify_host="192.0.2.250")


def test_reads_return_the_peers_bytes(backend, peer_factory):
    """read_sync, batch_read_sync and post_read copy the peer's registered
    bytes here without a call by the peer; a read's notification reaches
    the peer once the bytes are here."""
    name, options = backend
    eng = tensorferry.TransferEngine(name, **options)
    here = np.zeros(8 * MiB, dtype=np.uint8)
    eng.register_buffer(here.ctypes.data, here.nbytes)
    peer = peer_factory(name, options)
    got = peer.ask(op="alloc", name="pool", size=16 * MiB)
    base, session = got["addr"], got["session"]
    theirs = pattern(16 * MiB, 21)
    assert peer.ask(op="fill", name="pool", seed=21)["sha"] == sha(theirs)
    expect = np.zeros(8 * MiB, dtype=np.uint8)

    assert eng.read_sync(session, here.ctypes.data + 3, base + 12345, 4 * MiB) == 0, eng.last_error
    expect[3:3 + 4 * MiB] = theirs[12345:12345 + 4 * MiB]
    locals_, remotes, lens = [], [], []
    for k in range(32):
        n = 1000 + 97 * k
        at = 5 * MiB + k * 8192
        locals_.append(here.ctypes.data + at)
        remotes.append(base + 8 * MiB + k * 100_000)
        lens.append(n)
        expect[at:at + n] = theirs[8 * MiB + k * 100_000:8 * MiB + k * 100_000 + n]
    assert eng.batch_read_sync(session, locals_, remotes, lens) == 0, eng.last_error
    assert sha(here) == sha(expect)

    peer.tell(op="watch", n=1, seconds=120)
    with eng.post_read(session, [here.ctypes.data + 7 * MiB], [base + 15 * MiB], [MiB], notify=b"read done") as t:
        assert t.wait(120) is True
    expect[7 * MiB:] = theirs[15 * MiB:]
    assert sha(here) == sha(expect)
    assert [bytes.fromhex(g[1]) for g in peer.read()["got"]] == [b"read done"]
    # Past the peer's registered memory: refused, nothing read.
    before = sha(here)
    assert eng.read_sync(session, here.ctypes.data, base + 16 * MiB - 8, 16) < 0
    assert eng.last_error
    assert sha(here) == before
    eng.close()


def test_close_ends_another_threads_sync_transfer_and_returns_after_it(peer_factory):
    """A thread blocked in ``transfer_sync`` against a stopped peer: closing
    the engine from another thread ends that transfer, and ``close()``
    returns only once the blocked call has returned (so that no byte of it
    moves after ``close()``), long before the call's own timeout."""
    from conftest import BACKENDS

    name, options = next((b[1], b[2]) for b in BACKENDS if b[0] == "fabric-tcp")
    backend = (name, {**options, **PATIENT, "timeout": 600})
    eng, src, peer, base, session = open_pair(backend, peer_factory, peer_size=8 * MiB)
    assert eng.transfer_sync(session, src.ctypes.data, base, 4096) == 0, eng.last_error
    stop(peer.proc.pid)
    try:
        outcome = []
        started = threading.Event()

        def blocked() -> None:
            started.set()
            rc = eng.transfer_sync(session, src.ctypes.data, base, 4 * MiB)
            outcome.append((rc, time.monotonic()))

        t = threading.Thread(target=blocked)
        t.start()
        assert started.wait(60)
        # Blocked in the call: it has not returned.
        time.sleep(0.5)
        assert outcome == []
        start = time.monotonic()
        eng.close()
        closed = time.monotonic()
        # The call had returned by the time close() did, failed as closed.
        assert len(outcome) == 1, "close() returned before the blocked call did"
        rc, returned = outcome[0]
        assert returned <= closed
        assert rc == tensorferry.ERROR_CODES["io"], rc
        assert closed - start < 60, "close() waited for the call's own timeout"
        t.join(30)
        assert not t.is_alive()
    finally:
        os.kill(peer.proc.pid, signal.SIGCONT)
    assert peer.ask(op="session")["session"] == session
