"""The guard every ferry object takes: its keywords, and for each part
not given (the allow-list; CURVE's key and peers, a pair) the
environment's ``FERRY_ALLOW_FROM``, ``FERRY_CURVE_KEY`` and
``FERRY_CURVE_PEERS``, so that a deployment that sets the variables keeps
CURVE for an object given only an allow-list. Keys are pyzmq's
certificates (``zmq.auth.create_certificates``)."""

import os
import re
import stat
import time
from pathlib import Path

import pytest
import zmq.auth

import tensorferry


def pair(tmp: Path, name: str) -> tuple:
    """A key pair: (public, secret) certificate paths, the secret one its
    owner's alone; and the public key in Z85."""
    d = tmp / name
    d.mkdir()
    public, secret = zmq.auth.create_certificates(str(d), name)
    os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)
    return public, secret, zmq.auth.load_certificate(public)[0].decode()


@pytest.fixture
def env_keys(tmp_path, monkeypatch):
    """CURVE from the environment: this process's key pair `env`, admitting
    `peer`."""
    _, secret, me = pair(tmp_path, "env")
    peer_public, _, peer = pair(tmp_path, "peer")
    for var in ("FERRY_ALLOW_FROM", "FERRY_CURVE_KEY", "FERRY_CURVE_PEERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FERRY_CURVE_KEY", secret)
    monkeypatch.setenv("FERRY_CURVE_PEERS", peer_public)
    return me, peer


def test_the_environment_guards_an_object_given_nothing(env_keys):
    me, peer = env_keys
    g = tensorferry.Guard()
    assert g.curve and g.public_key == me and g.peers == [peer]
    assert g.allow_from == []


def test_an_allow_list_given_keeps_curve_from_the_environment(env_keys, monkeypatch):
    me, _ = env_keys
    monkeypatch.setenv("FERRY_ALLOW_FROM", "10.9.9.9")
    g = tensorferry.Guard(allow_from="127.0.0.1")
    assert g.allow_from == ["127.0.0.1"], "the keyword, not the variable"
    assert g.curve and g.public_key == me
    # The engine takes the same: its inbox serves with the environment's key.
    eng = tensorferry.TransferEngine("local", allow_from="127.0.0.1", notify_host="127.0.0.1")
    try:
        assert f"|{me}@tcp://" in eng.session_id, eng.session_id
    finally:
        eng.close()


def test_keys_given_replace_the_environments_pair_and_the_allow_list_comes_from_it(
    env_keys, tmp_path, monkeypatch
):
    monkeypatch.setenv("FERRY_ALLOW_FROM", "10.9.9.9, 10.9.9.10")
    _, secret, mine = pair(tmp_path, "mine")
    public_admitted, _, admitted = pair(tmp_path, "admitted")
    g = tensorferry.Guard(curve_key=secret, curve_peers=public_admitted)
    assert g.public_key == mine and g.peers == [admitted]
    assert g.allow_from == ["10.9.9.9", "10.9.9.10"]


def test_half_a_pair_or_a_bad_setting_is_refused_by_its_name(env_keys, tmp_path, monkeypatch):
    _, secret, _ = pair(tmp_path, "half")
    # A key given without peers: the environment's peers are not mixed in.
    with pytest.raises(ValueError, match="curve_key.*curve_peers|curve_peers.*curve_key"):
        tensorferry.Guard(curve_key=secret)
    monkeypatch.setenv("FERRY_ALLOW_FROM", "not-an-address")
    with pytest.raises(ValueError, match="FERRY_ALLOW_FROM"):
        tensorferry.Guard()
    monkeypatch.delenv("FERRY_ALLOW_FROM")
    # A secret certificate others may read is refused.
    os.chmod(secret, 0o644)
    monkeypatch.setenv("FERRY_CURVE_KEY", secret)
    with pytest.raises(ValueError, match="FERRY_CURVE_KEY"):
        tensorferry.Guard()


def test_verdicts_admit_the_listed_address_and_key_only(env_keys, monkeypatch):
    _, peer = env_keys
    g = tensorferry.Guard(allow_from="127.0.0.1")
    key = zmq.utils.z85.decode(peer.encode())
    ok, user = g.verdict("ferry", "127.0.0.1", b"CURVE", key)
    assert ok and user == peer, (ok, user)
    # The same key from another address; another key; no key.
    assert g.verdict("ferry", "127.0.0.2", b"CURVE", key)[0] is False
    assert g.verdict("ferry", "127.0.0.1", b"CURVE", bytes(32))[0] is False
    assert g.verdict("ferry", "127.0.0.1", b"NULL", b"")[0] is False


def test_under_curve_an_engine_notifies_only_engines_it_admits(tmp_path, monkeypatch):
    for var in ("FERRY_ALLOW_FROM", "FERRY_CURVE_KEY", "FERRY_CURVE_PEERS"):
        monkeypatch.delenv(var, raising=False)
    a_public, a_secret, _ = pair(tmp_path, "a")
    b_public, b_secret, b_key = pair(tmp_path, "b")
    c_public, c_secret, _ = pair(tmp_path, "c")
    # a admits c alone; b admits a (so b's inbox would take a's message).
    a = tensorferry.TransferEngine("local", curve_key=a_secret, curve_peers=c_public, notify_host="127.0.0.1")
    b = tensorferry.TransferEngine("local", curve_key=b_secret, curve_peers=a_public, notify_host="127.0.0.1")
    try:
        with pytest.raises(tensorferry.FerryError, match=re.escape(b_key) + ".*not among the keys"):
            a.notify(b.session_id, b"for c's eyes")
        time.sleep(0.3)
        assert b.notifications() == []
    finally:
        a.close()
        b.close()
