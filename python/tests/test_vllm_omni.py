"""vLLM-omni 0.30 moves stage payloads through FerryConnector: two stage
processes (vllm_omni/peer.py) in vLLM-omni's own environment
(scripts/vllm-omni-env) with ferry's wheel installed as a user installs it,
each making its connector through vLLM-omni's plugin loading, config
parsing and factory.

Needs ``FERRY_VLLM_OMNI_PYTHON`` (that environment's python, ferry's wheel
installed in it); skipped without it, unless ``FERRY_REQUIRE_VLLM_OMNI=1``
(as scripts/test sets), which makes its absence a failure.

The claim socket is spoken to directly too (``Claimant``: a DEALER of this
process, in its own pyzmq context, as a receiver's or a stranger's)."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest
import zmq

from procs import LineProcess, required_setting

import tensorferry
from tensorferry.vllm_omni import _control as control

PYTHON = required_setting("FERRY_VLLM_OMNI_PYTHON", "FERRY_REQUIRE_VLLM_OMNI", "scripts/vllm-omni-env")

# One worker runs them, with test_vllm_omni_guard.py's (scripts/test runs
# pytest-xdist): each module's stages start once, and no two workers
# import vLLM at once on a small machine.
pytestmark = pytest.mark.xdist_group("vllm-omni")

#: Every answer comes within this (vLLM's import takes ~15 s of it).
ANSWER_WITHIN = 180.0
PAYLOADS = 200
BIG = (6, 104, 195)  # payloads with a 64 MiB leaf (peer.payload)


class Stage(LineProcess):
    """A stage process (vllm_omni/peer.py). It starts at once; its greeting
    is awaited at the first question, so that stages start side by side
    (vLLM's import takes a while)."""

    def __init__(self, role: str, scratch: str, **extra: Any) -> None:
        # vLLM's import starts background builds of GPU kernels (humming)
        # in child processes, which fail without CUDA after seconds of CPU
        # and could outlive a stage the test kills: its own switch is off.
        # Their temporary files (torch's inductor makes a cache directory at
        # import) go to a directory the test removes.
        env = {**os.environ, "HUMMING_DISABLE_PARALLEL_BUILD": "1", "TMPDIR": scratch}
        spec = {"role": role, "extra": {"backend": "local", **extra}}
        super().__init__("vllm_omni/peer.py", spec, python=PYTHON, env=env, within=ANSWER_WITHIN, greet=False)

    def ask(self, **cmd: Any) -> Dict[str, Any]:
        if self.hello is None:
            self.hello = self.read()
            assert self.hello.get("ready") == "FerryConnector", self.hello
        return super().ask(**cmd)

    def health_until(self, what: str, check: Any, within: float = 30.0) -> Dict[str, Any]:
        """Asks for health until ``check(health)`` holds (the sender frees
        a payload when the receiver's done arrives, a moment after the
        receiver's get returned)."""
        end = time.monotonic() + within
        while True:
            h = self.ask(op="health")
            if check(h):
                return h
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not within {within} s: {h}")
            time.sleep(0.05)


class Stages:
    """Stage processes, closed at the end."""

    def __init__(self) -> None:
        self.made: List[Stage] = []
        self._scratch = tempfile.TemporaryDirectory(prefix="vllm-omni-stages-")

    def __call__(self, role: str, **extra: Any) -> Stage:
        stage = Stage(role, self._scratch.name, **extra)
        self.made.append(stage)
        return stage

    def close(self) -> None:
        for stage in self.made:
            stage.close()
        self._scratch.cleanup()


@pytest.fixture(scope="module")
def pair():
    """A sender (stage 0) and a receiver (stage 1) the tests share; the
    receiver gives up on a silent sender after a second. The sender admits
    only 127.0.0.1 (``allow_from``), so that every claim here passes its
    authentication handler (``fabric_pair`` is unguarded)."""
    made = Stages()
    yield made("sender", allow_from="127.0.0.1"), made("receiver", claim_timeout=1.0)
    made.close()


def key_of(put_key: str) -> str:
    """The key a sender holds a payload under (vLLM-omni's ``_make_key``
    of stages 0 and 1): what a claim names."""
    return f"{put_key}@0_1"


class Claimant:
    """A connection to a sender's claim socket from this process: a DEALER,
    from ``source`` (an address of this host; by default the kernel's
    choice, 127.0.0.1), a CURVE client when given ``curve`` (server key,
    public key, secret key; Z85)."""

    def __init__(
        self,
        ctx: zmq.Context,
        port: int,
        *,
        source: Optional[str] = None,
        curve: Optional[Tuple[bytes, bytes, bytes]] = None,
    ) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = curve
        # libzmq's "source;destination" form binds the connection's end.
        self.sock.connect(f"tcp://{source}:0;127.0.0.1:{port}" if source else f"tcp://127.0.0.1:{port}")

    def claim(self, key: str, claim: int, window_ms: int) -> None:
        self.sock.send_multipart(control.encode(control.CLAIM, control.Claim(key, claim, window_ms)))

    def end(self, verb: bytes, key: str, claim: int) -> None:
        self.sock.send_multipart(control.encode(verb, control.Ended(key, claim)))

    def answer(self, within: float) -> Optional[Tuple[bytes, Any]]:
        """The next answer, decoded, or None if none comes within ``within``
        seconds."""
        if not self.sock.poll(int(within * 1000)):
            return None
        decoded = control.decode(self.sock.recv_multipart())
        assert decoded is not None, "the sender answered with a malformed message"
        return decoded

    def close(self) -> None:
        self.sock.close(linger=0)


#: The libfabric plane over TCP: its reads run while ``get`` returns, so a
#: test can act while one is in flight (the local plane copies within the
#: call that posts the read).
FABRIC = {"backend": "fabric", "engine_options": {"provider": "tcp;ofi_rxm"}}


@pytest.fixture(scope="module")
def fabric_pair():
    """A sender and a receiver on the libfabric plane (``FABRIC``)."""
    made = Stages()
    yield made("sender", **FABRIC), made("receiver", claim_timeout=1.0, transfer_timeout=10.0, **FABRIC)
    made.close()


@pytest.fixture
def stages():
    made = Stages()
    yield made
    made.close()


def nothing_held(h: Dict[str, Any]) -> bool:
    return h["pool_used"] == 0 and h["sends_held"] == 0 and h["gets_pending"] == 0


def get_whole(receiver: Stage, **cmd: Any) -> Dict[str, Any]:
    """The receiver's ``get`` of ``cmd``, which must succeed."""
    got = receiver.ask(op="get", **cmd)
    assert got["ok"], got
    return got


def all_freed(sender: Stage, receiver: Stage) -> None:
    """Waits until the receiver, and then the sender, hold nothing."""
    receiver.health_until("the receiver holds nothing", nothing_held)
    sender.health_until("the sender holds nothing", nothing_held)


def whole_then_freed(sender: Stage, receiver: Stage, **cmd: Any) -> None:
    """The receiver's ``get`` of ``cmd`` succeeds, then the receiver and
    the sender hold nothing: how a test ends once the connector came
    through what it did."""
    get_whole(receiver, **cmd)
    all_freed(sender, receiver)


def grant_falsely(fake: zmq.Socket, receiver: Stage, session: str, grant: List[Any]) -> None:
    """Answers the receiver's claim, which comes to ``fake`` (a ROUTER),
    with a grant of ``session``'s region ``grant`` (address, size, header,
    data, generation): the receiver must not read it, so its poll fails."""
    assert fake.poll(30_000), "the receiver's claim did not come"
    routing, verb, body = fake.recv_multipart()
    claim = control.decode([verb, body])
    assert claim is not None and claim[0] == control.CLAIM, claim
    granted = control.Granted(claim[1].claim, session, *grant)
    fake.send_multipart([routing, *control.encode(control.GRANTED, granted)])
    assert receiver.read()["outcome"] == "failed"


def test_two_hundred_payloads_arrive_byte_exact_and_nothing_stays_held(pair):
    sender, receiver = pair
    total = 0
    for i in range(PAYLOADS):
        put = sender.ask(op="put", i=i)
        assert put["ok"] and put["meta"]["ferry"] == 1, put
        got = receiver.ask(op="get", i=i, meta=put["meta"])
        assert got["ok"], f"payload {i}: {got['why']}"
        assert got["size"] == put["size"]
        total += put["size"]
    assert total > 3 * 64 << 20
    sender.health_until("the sender frees every payload read", nothing_held)
    h = receiver.health_until("the receiver frees every payload released", nothing_held)
    assert h["gets"] >= PAYLOADS and h["errors"] == 0, h


def test_a_passed_deadline_returns_none_and_holds_nothing_after_abandon(pair):
    sender, receiver = pair
    meta = {"source_host": "127.0.0.1", "source_port": sender.ask(op="health")["zmq_port"]}
    assert meta["source_port"], "a sender listens from its start"
    # Not put yet: every claim is answered "missing" until the deadline.
    late = receiver.ask(op="get_by_deadline", i=3, meta=meta, seconds=0.5)
    assert late["outcome"] == "none" and late["elapsed"] >= 0.5, late
    receiver.ask(op="abandon", key="req-3")
    receiver.health_until("the abandoned receive holds nothing", nothing_held)
    # Put afterwards, it arrives.
    put = sender.ask(op="put", i=3)
    get_whole(receiver, i=3, meta=put["meta"])

    # A deadline that passes while a 64 MiB read may run: whatever the
    # deadline caught, the receive keeps its memory and a later get
    # finishes it, byte-exact.
    put = sender.ask(op="put", i=BIG[0])
    early = receiver.ask(op="get_by_deadline", i=BIG[0], meta=put["meta"], seconds=0.0005)
    assert early["outcome"] in ("none", "data"), early
    if early["outcome"] == "none":
        get_whole(receiver, i=BIG[0], meta=put["meta"])
    all_freed(sender, receiver)


def test_an_abandoned_get_holds_nothing_and_the_payload_stays_for_a_later_get(pair, fabric_pair):
    sender, receiver = fabric_pair
    # A 64 MiB read in flight, abandoned (a read may beat the polls that
    # look for it: then the payload is put again, a few times at most).
    for attempt in range(5):
        key = f"abandoned-{attempt}"
        put = sender.ask(op="put", i=BIG[1], key=key)
        state = receiver.ask(op="until_reading", i=BIG[1], key=key, meta=put["meta"], granted=True)["state"]
        if state == "reading":
            break
    assert state == "reading", "no read was ever caught in flight"
    receiver.ask(op="abandon", key=key)
    receiver.health_until("the abandoned receive holds nothing", nothing_held)
    # The sender got the release: the payload is unclaimed and still
    # there, and a new get reads it whole.
    sender.health_until("the claim is released", lambda h: h["sends_claimed"] == 0 and h["sends_held"] == 1)
    whole_then_freed(sender, receiver, i=BIG[1], key=key, meta=put["meta"])
    sender, receiver = pair
    # A claim not yet answered, abandoned at once.
    put = sender.ask(op="put", i=5)
    once = receiver.ask(op="get_once", i=5, meta=put["meta"])
    receiver.ask(op="abandon", key="req-5")
    receiver.health_until("the abandoned receive holds nothing", nothing_held)
    if not once["got"]:  # (the first call may have been answered at once)
        get_whole(receiver, i=5, meta=put["meta"])
    all_freed(sender, receiver)


def test_a_grant_of_the_metadatas_region_is_read_and_one_of_another_region_is_refused(pair):
    sender, receiver = pair
    # Payloads 2 and 386 are raw blocks of one size. Put again after a
    # cleanup, the second lands in the first's region (regions are taken
    # first fit): the first's metadata names the region the grant names,
    # of a later put. The read made early from the metadata is thrown away
    # and the grant's read again, and the receiver gets what the key holds.
    first = sender.ask(op="put", i=2, key="stale")
    sender.ask(op="cleanup", key="stale")
    second = sender.ask(op="put", i=386, key="stale")
    assert first["size"] == second["size"]
    assert first["meta"]["grant"][1] == second["meta"]["grant"][1], "the second put reuses the first's region"
    assert first["meta"]["grant"][5] != second["meta"]["grant"][5], "of another generation"
    before = receiver.ask(op="health")
    get_whole(receiver, i=386, key="stale", meta=first["meta"])
    h = receiver.health_until("the receiver holds nothing", nothing_held)
    assert h["early_reads_wasted"] == before["early_reads_wasted"] + 1, h
    assert h["grants_refused"] == before["grants_refused"], h

    # A put that replaces another still held lands in another region: the
    # grant then names a region the older metadata did not, which the
    # receiver does not read (a socket at the sender's address is no proof
    # of being the sender); the newer metadata's get reads it.
    third = sender.ask(op="put", i=2, key="replaced")
    fourth = sender.ask(op="put", i=386, key="replaced")
    assert third["meta"]["grant"][1] != fourth["meta"]["grant"][1], "the two puts are in two regions"
    assert receiver.ask(op="poll", i=386, key="replaced", meta=third["meta"])["outcome"] == "failed"
    h = receiver.ask(op="health")
    assert h["grants_refused"] == before["grants_refused"] + 1, h
    assert "but the put's metadata named" in h["last_error"], h
    whole_then_freed(sender, receiver, i=386, key="replaced", meta=fourth["meta"])


def test_a_grant_from_a_socket_that_is_not_the_sender_is_not_read(pair):
    sender, receiver = pair
    # A ROUTER of this process at another port stands for whoever binds
    # where a put's metadata says its sender is: it answers the claim with
    # a grant of another payload of the same size at the real sender (its
    # session is in any metadata), which the receiver must not read. The
    # metadata without the put's stamp, so that the grant decides (with
    # it, the receiver reads only what the metadata names, and needs no
    # answer: test_a_stamped_read_needs_no_answer_to_its_claim).
    put = sender.ask(op="put", i=2, key="asked")
    unstamped = {k: v for k, v in put["meta"].items() if k != "stamp"}
    other = sender.ask(op="put", i=386, key="secret")
    assert put["size"] == other["size"]
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    before = receiver.ask(op="health")
    receiver.tell(op="poll", i=2, key="asked", meta={**unstamped, "source_port": port}, within=30)
    session, addr, *_ = other["meta"]["grant"]
    grant_falsely(fake, receiver, session, other["meta"]["grant"][1:])
    h = receiver.ask(op="health")
    assert h["grants_refused"] == before["grants_refused"] + 1 and h["gets"] == before["gets"], h
    assert f"at {addr:#x}, but the put's metadata named" in h["last_error"], h
    # The receiver released the claim (to the fake), and read nothing of
    # it: both payloads are still there, whole, for the real sender.
    assert fake.poll(5_000), "the refused grant was not released"
    assert control.decode(fake.recv_multipart()[1:])[0] == control.RELEASE
    fake.close(linger=0)
    ctx.term()
    for i, key, meta in ((2, "asked", put["meta"]), (386, "secret", other["meta"])):
        get_whole(receiver, i=i, key=key, meta=meta)
    all_freed(sender, receiver)


def test_only_a_claims_owner_ends_it_and_asking_again_does_not_lengthen_it(pair):
    sender, receiver = pair
    # Without CURVE a claim's owner is its connection: two connections of
    # this process, "owner" holding a claim, "other" knowing its key and
    # claim id (as anyone who sees the traffic does).
    put = sender.ask(op="put", i=9, key="owned")
    port = sender.ask(op="health")["zmq_port"]
    key = key_of("owned")
    ctx = zmq.Context()
    owner, other = Claimant(ctx, port), Claimant(ctx, port)
    try:
        claim = 0x5EC0DE
        owner.claim(key, claim, 1500)
        verb, granted = owner.answer(10)
        granted_at = time.monotonic()
        assert verb == control.GRANTED and [granted.session, granted.addr] == put["meta"]["grant"][:2], granted
        before = sender.ask(op="health")
        assert before["sends_claimed"] == 1, before
        # The other's done and release of that claim change nothing, and
        # its claim with the same id is busy.
        other.end(control.DONE, key, claim)
        other.end(control.RELEASE, key, claim)
        other.claim(key, claim, 600_000)
        verb, refused = other.answer(10)
        assert verb == control.BUSY and refused.claim == claim
        h = sender.ask(op="health")
        assert h["foreign_ends"] == before["foreign_ends"] + 2, h
        assert h["sends_claimed"] == 1 and h["sends_held"] == 1, h
        # The owner asking again for a 600 s window gets the same grant,
        # and the claim still ends with its first window (1.5 s, and the
        # sender's grace of 1 s).
        owner.claim(key, claim, 600_000)
        verb, again = owner.answer(10)
        assert verb == control.GRANTED and again == granted
        h = sender.health_until("the claim ends with its first window", lambda h: h["sends_claimed"] == 0, within=20)
        assert time.monotonic() - granted_at < 10, "the claim outlived its first window"
        assert h["expired_claims"] == before["expired_claims"] + 1 and h["sends_held"] == 1, h
    finally:
        owner.close()
        other.close()
        ctx.term()
    # The payload is whole: the receiver reads it.
    whole_then_freed(sender, receiver, i=9, key="owned", meta=put["meta"])


def test_the_allow_list_refuses_an_address_not_on_it(pair):
    sender, receiver = pair
    put = sender.ask(op="put", i=10, key="listed")
    before = sender.ask(op="health")
    assert before["guard"] == {"curve": False, "allow_from": ["127.0.0.1"]}, before
    port = before["zmq_port"]
    ctx = zmq.Context()
    # From 127.0.0.2 (loopback too, but not on the list): refused before
    # its claim is read; from 127.0.0.1 the same claim is granted.
    outside, inside = Claimant(ctx, port, source="127.0.0.2"), Claimant(ctx, port, source="127.0.0.1")
    try:
        outside.claim(key_of("listed"), 1, 600_000)
        outside.end(control.DONE, key_of("listed"), 1)
        assert outside.answer(2) is None, "a claim from 127.0.0.2 was answered"
        h = sender.ask(op="health")
        assert h["connections_refused"] > before["connections_refused"], h
        assert h["sends_claimed"] == 0 and h["sends_held"] == 1, h
        inside.claim(key_of("listed"), 2, 5_000)
        verb, _ = inside.answer(10)
        assert verb == control.GRANTED
        inside.end(control.RELEASE, key_of("listed"), 2)
        sender.health_until("the claim is released", lambda h: h["sends_claimed"] == 0)
    finally:
        outside.close()
        inside.close()
        ctx.term()
    whole_then_freed(sender, receiver, i=10, key="listed", meta=put["meta"])


def test_a_sender_killed_mid_get_is_reported_and_the_receiver_holds_nothing(fabric_pair, stages):
    _, receiver = fabric_pair
    doomed = [stages("sender", **FABRIC) for _ in range(4)]
    # Killed while the receiver's read of its 64 MiB runs: the read fails
    # (or, if it beat the kill, returned every byte). Should a read beat
    # the polls that look for it, the next sender is tried.
    for sender in doomed[:3]:
        put = sender.ask(op="put", i=BIG[2])
        state = receiver.ask(op="until_reading", i=BIG[2], meta=put["meta"])["state"]
        if state == "reading":
            break
    assert state == "reading", "no read was ever caught in flight"
    sender.kill()
    outcome = receiver.ask(op="poll", i=BIG[2], meta=put["meta"], within=30)["outcome"]
    assert outcome in ("data", "failed"), outcome
    # Once the read has ended (failed, or ended at its deadline), nothing.
    receiver.health_until("the receiver holds nothing", nothing_held)

    # Killed before the claim: the claim goes unanswered, which is
    # reported once claim_timeout passes.
    sender = doomed[3]
    put = sender.ask(op="put", i=11)
    sender.kill()
    errors = receiver.ask(op="health")["errors"]
    assert receiver.ask(op="poll", i=11, meta=put["meta"], within=30)["outcome"] == "failed"
    h = receiver.ask(op="health")
    assert h["errors"] == errors + 1 and "did not answer its claim" in h["last_error"], h
    assert h["timeouts"] >= 1, h
    # The read the receiver began from the put's metadata ends too (it
    # fails, or its deadline ends it), and then nothing is held.
    receiver.health_until("the receiver holds nothing", nothing_held)


def test_a_receiver_killed_mid_read_is_reported_and_the_sender_frees_the_payload(fabric_pair, stages):
    sender, _ = fabric_pair
    receivers = [stages("receiver", transfer_timeout=2.0, **FABRIC) for _ in range(3)]
    # Killed while its granted read of the 64 MiB runs (should a read beat
    # the polls, the next receiver is tried).
    for n, receiver in enumerate(receivers):
        key = f"orphan-{n}"
        put = sender.ask(op="put", i=BIG[0], key=key)
        state = receiver.ask(op="until_reading", i=BIG[0], key=key, meta=put["meta"], granted=True)["state"]
        if state == "reading":
            break
        sender.ask(op="cleanup", key=key)
    assert state == "reading", "no granted read was ever caught in flight"
    expired = sender.ask(op="health")["expired_claims"]
    receiver.kill()
    # The request is over (vLLM-omni cleans up its keys): the payload goes
    # as soon as no receiver holds it, here once the dead receiver's claim
    # window ends, which the sender reports.
    sender.ask(op="cleanup", key=key)
    h = sender.health_until("the sender frees the payload", nothing_held, within=30)
    assert h["expired_claims"] == expired + 1, h


def test_get_returns_none_for_what_is_not_there_whatever_the_metadata(pair):
    sender, receiver = pair
    errors = receiver.ask(op="health")["errors"]
    # No metadata, and no sender configured (vLLM-omni's chunk adapter
    # polls so): None, from get and from get_with_deadline alike.
    for _ in range(3):
        once = receiver.ask(op="get_once", key="nobody", meta=None)
        assert once == {"got": False}, once
    late = receiver.ask(op="get_by_deadline", key="nobody", meta=None, seconds=0.2)
    assert late["outcome"] == "none" and late["elapsed"] >= 0.2, late
    # vLLM-omni's metadata (the sender's address) of a key nobody put.
    port = sender.ask(op="health")["zmq_port"]
    addressed = {"source_host": "127.0.0.1", "source_port": port}
    late = receiver.ask(op="get_by_deadline", key="nobody", meta=addressed, seconds=0.3)
    assert late["outcome"] == "none", late
    assert receiver.ask(op="get_once", key="nobody", meta=addressed) == {"got": False}
    receiver.ask(op="abandon", key="nobody")
    # ferry's metadata of a put cleaned up since: its stamp says freed, the
    # sender answers "missing", and get says None (one error: the put is
    # gone).
    put = sender.ask(op="put", i=12, key="gone")
    sender.ask(op="cleanup", key="gone")
    wasted = receiver.ask(op="health")["early_reads_wasted"]
    assert receiver.ask(op="get_once", i=12, key="gone", meta=put["meta"]) == {"got": False}
    late = receiver.ask(op="get_by_deadline", i=12, key="gone", meta=put["meta"], seconds=0.3)
    assert late["outcome"] == "none", late
    receiver.ask(op="abandon", key="gone")
    h = receiver.health_until("the receiver holds nothing", nothing_held)
    assert h["early_reads_wasted"] == wasted + 1 and h["errors"] == errors + 1, h
    assert "no longer has that put" in h["last_error"], h
    all_freed(sender, receiver)
    # The pools' pages were made ahead (in a thread, from the start).
    for stage in (sender, receiver):
        h = stage.health_until("the pool's pages are made", lambda h: h["pool_prefault_seconds"] is not None)
        assert h["pool_prefault_seconds"] > 0, h


def test_a_stamped_read_needs_no_answer_to_its_claim(pair):
    sender, receiver = pair
    # The put's metadata names its region and its stamp: the receiver reads
    # both, and the payload is back from its first get, on the local plane
    # (which reads within the call), with no claim: the claim socket the
    # metadata names (here one that never answers) hears nothing, and
    # "taken", with the put's token, goes to the engine the metadata names
    # as a notification, which frees the payload there.
    put = sender.ask(op="put", i=4, key="stamped")
    at, token = put["meta"]["stamp"]
    assert at >= put["size"] and at % 8 == 0 and token, put["meta"]
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        before = receiver.ask(op="health")
        once = receiver.ask(op="get_once", i=4, key="stamped", meta={**put["meta"], "source_port": port})
        assert once == {"got": True, "wrong": None}, once
        h = receiver.ask(op="health")
        assert h["gets"] == before["gets"] + 1 and h["early_reads_wasted"] == before["early_reads_wasted"], h
        # The sender, never asked on its claim socket, frees the payload.
        all_freed(sender, receiver)
        assert not silent.poll(500), "a claim or a taken came to the claim socket"
    finally:
        silent.close(linger=0)
        ctx.term()
    # A "taken" with another token frees nothing: the token is the proof of
    # having the put's metadata.
    put = sender.ask(op="put", i=4, key="stamped")
    forged = control.encode_note(control.TAKEN, control.Taken(key_of("stamped"), put["meta"]["stamp"][1] ^ 1))
    engine = tensorferry.TransferEngine("local")
    try:
        engine.notify(put["meta"]["grant"][0], forged)
        time.sleep(0.5)
    finally:
        engine.close()
    h = sender.ask(op="health")
    assert h["sends_held"] == 1 and h["sends_claimed"] == 0, h
    assert receiver.ask(op="get_once", i=4, key="stamped", meta=put["meta"]) == {"got": True, "wrong": None}
    all_freed(sender, receiver)
