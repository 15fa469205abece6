"""FerryConnector under CURVE: two stage processes (vllm_omni/peer.py, in
vLLM-omni's environment, through its factory) with keys pyzmq made
(``zmq.auth.create_certificates``), and connections of this process to
the sender's claim socket: strangers without a key or with a key the
sender does not admit, an admitted key that is not the claim's owner, and
a fake sender holding the real sender's key.

The keys: the sender admits the receiver's and the bystander's; the
receiver admits only the sender's (so that a get with vLLM-omni's own
metadata, ``{source_host, source_port}``, claims from it); the stranger's
nobody admits. The sender also admits only 127.0.0.1 (``allow_from``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Tuple

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from test_vllm_omni import Claimant, Stages, get_whole, grant_falsely, key_of, nothing_held, whole_then_freed
from tensorferry.vllm_omni import _control as control

# One worker runs them all, with test_vllm_omni.py's (scripts/test runs
# pytest-xdist): one pair of stages, started once.
pytestmark = pytest.mark.xdist_group("vllm-omni")

NAMES = ("sender", "receiver", "bystander", "stranger")


class Keys:
    """The certificates, in a directory removed at the end."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="vllm-omni-keys-")
        self.root = Path(self._dir.name)
        certs = self.root / "certs"
        certs.mkdir()
        self.public: Dict[str, bytes] = {}
        for name in NAMES:
            public, secret = zmq.auth.create_certificates(certs, name)
            # ferry takes a secret certificate only if no one else may read it.
            os.chmod(secret, 0o600)
            self.public[name] = zmq.auth.load_certificate(public)[0]
        self.sender_admits = self.admitting("sender-admits", "receiver", "bystander")
        self.receiver_admits = self.admitting("receiver-admits", "sender")

    def admitting(self, folder: str, *names: str) -> str:
        """A directory of the public certificates of ``names``."""
        d = self.root / folder
        d.mkdir()
        for name in names:
            shutil.copy(self.certificate(name), d)
        return str(d)

    def certificate(self, name: str) -> str:
        return str(self.root / "certs" / f"{name}.key")

    def secret(self, name: str) -> str:
        return str(self.root / "certs" / f"{name}.key_secret")

    def client(self, name: str, server: str = "sender") -> Tuple[bytes, bytes, bytes]:
        """``Claimant``'s ``curve``: ``name``'s keys, connecting to ``server``."""
        public, secret = zmq.auth.load_certificate(self.secret(name))
        return self.public[server], public, secret

    def close(self) -> None:
        self._dir.cleanup()


@pytest.fixture(scope="module")
def keys():
    k = Keys()
    yield k
    k.close()


@pytest.fixture(scope="module")
def curve_pair(keys):
    """A sender and a receiver with their keys (the receiver gives up on a
    silent sender after two seconds)."""
    made = Stages()
    sender = made(
        "sender", curve_key=keys.secret("sender"), curve_peers=keys.sender_admits, allow_from=["127.0.0.1"]
    )
    receiver = made("receiver", claim_timeout=2.0, curve_key=keys.secret("receiver"), curve_peers=keys.receiver_admits)
    yield sender, receiver
    made.close()


def test_stages_hand_off_payloads_byte_exact_over_curve(curve_pair, keys):
    sender, receiver = curve_pair
    h = sender.ask(op="health")
    assert h["guard"] == {"curve": True, "allow_from": ["127.0.0.1"]}, h
    refused = h["connections_refused"]
    info = sender.ask(op="info")
    sender_key = keys.public["sender"].decode()
    # The claim socket and the engine serve with one key: the sender's.
    assert info["public_key"] == sender_key and f"|{sender_key}@tcp://" in info["session_id"], info
    total = 0
    for i in range(24):  # payload 6 has a 64 MiB leaf
        put = sender.ask(op="put", i=i)
        assert put["ok"] and put["meta"]["source_key"] == sender_key, put
        got = receiver.ask(op="get", i=i, meta=put["meta"])
        assert got["ok"], f"payload {i}: {got['why']}"
        total += put["size"]
    assert total > 64 << 20
    # vLLM-omni's own receive paths name only the sender's address: the
    # receiver claims from the one key it admits.
    put = sender.ask(op="put", i=30, key="addressed")
    meta = {"source_host": put["meta"]["source_host"], "source_port": put["meta"]["source_port"]}
    get_whole(receiver, i=30, key="addressed", meta=meta)
    sender.health_until("the sender frees every payload read", nothing_held)
    h = receiver.health_until("the receiver frees every payload", nothing_held)
    assert h["gets"] >= 25 and h["errors"] == 0 and h["grants_refused"] == 0, h
    # Nobody of the deployment was refused.
    assert sender.ask(op="health")["connections_refused"] == refused


def test_strangers_are_refused_before_their_claims_are_read(curve_pair, keys):
    sender, receiver = curve_pair
    put = sender.ask(op="put", i=7, key="guarded")
    before = sender.ask(op="health")
    port, key = before["zmq_port"], key_of("guarded")
    ctx = zmq.Context()
    strangers = {
        # No key: libzmq refuses it at the greeting (the mechanisms differ).
        "no key": Claimant(ctx, port),
        # A key the sender does not admit: its handler refuses it.
        "a key not admitted": Claimant(ctx, port, curve=keys.client("stranger")),
        # An admitted key from an address off the allow-list.
        "an admitted key from 127.0.0.2": Claimant(ctx, port, source="127.0.0.2", curve=keys.client("bystander")),
    }
    try:
        for who, c in strangers.items():
            c.claim(key, 77, 600_000)
            c.end(control.DONE, key, 77)
        for who, c in strangers.items():
            assert c.answer(2) is None, f"a claim from {who} was answered"
    finally:
        for c in strangers.values():
            c.close()
        ctx.term()
    h = sender.ask(op="health")
    # The two the handler judged (at least once each: refused, libzmq
    # connects again).
    assert h["connections_refused"] >= before["connections_refused"] + 2, h
    assert h["sends_held"] == 1 and h["sends_claimed"] == 0 and h["foreign_ends"] == before["foreign_ends"], h
    whole_then_freed(sender, receiver, i=7, key="guarded", meta=put["meta"])


def test_a_claims_owner_is_its_key_not_its_connection(curve_pair, keys):
    sender, receiver = curve_pair
    put = sender.ask(op="put", i=8, key="keyed")
    port, key = sender.ask(op="health")["zmq_port"], key_of("keyed")
    ctx = zmq.Context()
    # The bystander claims; the receiver's key (admitted too) knows the key
    # and the claim id; a second connection of the bystander's key is the
    # same owner.
    holder = Claimant(ctx, port, curve=keys.client("bystander"))
    other = Claimant(ctx, port, curve=keys.client("receiver"))
    again = Claimant(ctx, port, curve=keys.client("bystander"))
    try:
        holder.claim(key, 42, 30_000)
        verb, granted = holder.answer(10)
        assert verb == control.GRANTED and [granted.session, granted.addr] == put["meta"]["grant"][:2], granted
        before = sender.ask(op="health")
        other.end(control.DONE, key, 42)
        other.end(control.RELEASE, key, 42)
        other.claim(key, 42, 30_000)
        assert other.answer(10)[0] == control.BUSY
        h = sender.ask(op="health")
        assert h["foreign_ends"] == before["foreign_ends"] + 2 and h["sends_claimed"] == 1, h
        # The receiver's own get is busy meanwhile: nothing is read.
        assert receiver.ask(op="get", i=8, key="keyed", meta=put["meta"], within=0.5)["ok"] is False
        again.end(control.RELEASE, key, 42)
        sender.health_until("the owner's key released it", lambda h: h["sends_claimed"] == 0 and h["sends_held"] == 1)
    finally:
        for c in (holder, other, again):
            c.close()
        ctx.term()
    whole_then_freed(sender, receiver, i=8, key="keyed", meta=put["meta"])


def test_a_grant_naming_an_engine_of_another_key_is_not_read(curve_pair, keys):
    sender, receiver = curve_pair
    # A ROUTER of this process serving with the sender's own key (as a
    # thief of it would) at another port, for a get with vLLM-omni's
    # metadata (an address, no region): its grant names an engine whose
    # key is the bystander's, which the receiver does not read.
    put = sender.ask(op="put", i=2, key="thief")
    _, secret = zmq.auth.load_certificate(keys.secret("sender"))
    ctx = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    fake.curve_server = True
    fake.curve_secretkey = secret
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    before = receiver.ask(op="health")
    receiver.tell(op="poll", i=2, key="thief", meta={"source_host": "127.0.0.1", "source_port": port}, within=30)
    try:
        session = f"local:elsewhere|{keys.public['bystander'].decode()}@tcp://127.0.0.1:1"
        grant_falsely(fake, receiver, session, put["meta"]["grant"][1:])
    finally:
        fake.close(linger=0)
        ctx.term()
    h = receiver.ask(op="health")
    assert h["grants_refused"] == before["grants_refused"] + 1 and h["gets"] == before["gets"], h
    assert "whose key is not the sender's" in h["last_error"], h
    whole_then_freed(sender, receiver, i=2, key="thief", meta=put["meta"])


def test_the_receivers_keys_decide_whom_it_claims_from(curve_pair, keys):
    sender, receiver = curve_pair
    put = sender.ask(op="put", i=12, key="whom")
    meta = put["meta"]
    # A source_key the receiver does not admit: not claimed.
    errors = receiver.ask(op="health")["errors"]
    got = receiver.ask(op="poll", i=12, key="whom", meta={**meta, "source_key": keys.public["bystander"].decode()})
    assert got["outcome"] == "failed"
    h = receiver.ask(op="health")
    assert h["errors"] == errors + 1 and "is not one this connector admits" in h["last_error"], h
    assert sender.ask(op="health")["sends_claimed"] == 0

    # Connectors made in the receiver's process, as the bystander (whose key
    # the sender admits) admitting two keys.
    two = keys.admitting("bystander-admits", "sender", "stranger")
    bystander = {"curve_key": keys.secret("bystander"), "curve_peers": two, "pool_size": 1 << 26}
    addressed = {"source_host": meta["source_host"], "source_port": meta["source_port"]}
    # With vLLM-omni's metadata and two keys admitted, which is the
    # sender's is not known: the get says so.
    made = receiver.ask(op="make", extra=bystander, i=12, key="whom", meta=addressed)
    assert made["made"] and made["get"]["raised"] == "RuntimeError", made
    assert "set extra sender_key" in made["get"]["why"], made
    # Named by sender_key (its certificate), it claims and reads.
    named = {**bystander, "sender_key": keys.certificate("sender")}
    made = receiver.ask(op="make", extra=named, i=12, key="whom", meta=addressed)
    assert made["made"] and made["get"]["ok"], made
    sender.health_until("the sender holds nothing", nothing_held)

    # Settings that cannot be one guard, named.
    cases = [
        ({"allow_from": "127.0.0.1", "engine_options": {"allow_from": ["127.0.0.2"]}}, "differ"),
        ({**bystander, "sender_key": keys.certificate("bystander")}, "is not one of the keys curve_peers admits"),
        ({"sender_key": keys.certificate("sender")}, "sender_key needs CURVE"),
        ({"curve_key": keys.certificate("bystander"), "curve_peers": two}, "curve_key"),
    ]
    for extra, why in cases:
        made = receiver.ask(op="make", extra=extra)
        assert not made["made"] and made["raised"] == "ValueError" and why in made["why"], (extra, made)
    # The same value given twice (two spellings) is one guard.
    made = receiver.ask(op="make", extra={"allow_from": "127.0.0.1", "engine_options": {"allow_from": ["127.0.0.1"]}})
    assert made["made"] and made["health"]["guard"]["allow_from"] == ["127.0.0.1"], made
    # A readable secret certificate is refused (the guard names the fix).
    loose = keys.root / "loose.key_secret"
    shutil.copy(keys.secret("bystander"), loose)
    os.chmod(loose, 0o644)
    made = receiver.ask(op="make", extra={"curve_key": str(loose), "curve_peers": two})
    assert not made["made"] and "chmod 600" in made["why"], made


def test_the_authentication_handler_answers_every_request_with_the_guards_verdict(keys):
    import tensorferry
    from tensorferry.vllm_omni._zap import ZAP_ENDPOINT, ZapHandler

    # The handler the connector runs, on a context of this process, put
    # requests as libzmq puts them (and some libzmq never would).
    guard = tensorferry.Guard(allow_from="127.0.0.1", curve_key=keys.secret("sender"), curve_peers=keys.sender_admits)
    ctx = zmq.Context()
    handler = ZapHandler(ctx, guard)
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(ZAP_ENDPOINT)

    def ask(*frames: bytes) -> list:
        req.send_multipart(list(frames))
        assert req.poll(5000), f"no answer to {frames}"
        return req.recv_multipart()

    try:
        receiver = keys.public["receiver"]
        raw = z85.decode(receiver)
        assert ask(b"1.0", b"7", b"ferry", b"127.0.0.1", b"", b"CURVE", raw) == [
            b"1.0", b"7", b"200", b"OK", receiver, b""
        ]
        stranger = z85.decode(keys.public["stranger"])
        refused = {
            "a key not admitted": (b"1.0", b"8", b"ferry", b"127.0.0.1", b"", b"CURVE", stranger),
            "off the allow-list": (b"1.0", b"9", b"ferry", b"127.0.0.2", b"", b"CURVE", raw),
            "no CURVE": (b"1.0", b"10", b"ferry", b"127.0.0.1", b"", b"NULL"),
            "another version": (b"2.0", b"11", b"ferry", b"127.0.0.1", b"", b"CURVE", raw),
            "too short": (b"1.0", b"12"),
            "not text": (b"1.0", b"13", b"\xff\xfe", b"\xff", b"", b"CURVE", raw),
            "a domain ferry does not guard": (b"1.0", b"14", b"other", b"127.0.0.1", b"", b"CURVE", raw),
            "a key of 3 bytes": (b"1.0", b"15", b"ferry", b"127.0.0.1", b"", b"CURVE", b"abc"),
        }
        for why, frames in refused.items():
            reply = ask(*frames)
            assert reply[:3] == [b"1.0", frames[1], b"400"] and reply[4] == b"", (why, reply)
            # ferry's verdict, word for word, where the request is one.
            if len(frames) == 7 and frames[0] == b"1.0" and frames[2] != b"\xff\xfe":
                ok, text = guard.verdict(frames[2].decode(), frames[3].decode(), frames[5], frames[6])
                assert not ok and reply[3] == text.encode(), (why, reply, text)
        assert handler.refused == len(refused)
        # Still answering after all of them.
        assert ask(b"1.0", b"16", b"ferry", b"127.0.0.1", b"", b"CURVE", raw)[2] == b"200"
        # One handler per context: a second is refused, by name.
        with pytest.raises(RuntimeError, match="another handler already serves"):
            ZapHandler(ctx, guard)
    finally:
        req.close(linger=0)
        handler.close()
        ctx.term()


def test_the_sender_listens_only_on_the_endpoints_the_book_names(curve_pair):
    # Read from /proc: the claim socket and its engine's notification
    # inbox (its TCP port and Unix name), each a row of the book's endpoint table, and nothing else
    # (vLLM-omni's import included).
    from test_endpoints import book, inbox_of, listening

    sender, _ = curve_pair
    info = sender.ask(op="info")
    claim = sender.ask(op="health")["zmq_port"]
    inbox, server = inbox_of(info["session_id"])
    assert server == info["public_key"], info
    known = {
        claim: ("FerryConnector", "claim"),
        int(inbox.rsplit(":", 1)[1]): ("TransferEngine", "inbox"),
        f"@tensorferry-notify/{inbox.removeprefix('tcp://')}": ("TransferEngine", "inbox-local"),
    }
    rows = book()
    ports = listening(sender.proc.pid)
    for port in ports:
        assert port in known, f"the sender listens on {port!r}, which the book's endpoint table does not name"
        assert known[port] in rows, known[port]
    assert set(known) <= set(ports), (known, ports)
