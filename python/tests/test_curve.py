"""ferry's nodes over CurveZMQ from Python, with keys pyzmq made
(``zmq.auth.create_certificates``): a coordinator that admits its
instances' keys, instances that admit the coordinator's, a hand-off with
every byte checked while a keyless stranger at 127.0.0.1 pushes forged
messages at every endpoint; and the combinations that are refused."""

import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import tensorferry
from procs import required_module

zmq = required_module("zmq")
auth = required_module("zmq.auth")


@pytest.fixture
def keys():
    """pyzmq's certificates: the coordinator's in coordinator/, the
    instances' in instances/."""
    with tempfile.TemporaryDirectory(prefix="ferry-py-curve-") as d:
        root = Path(d)
        (root / "coordinator").mkdir()
        (root / "instances").mkdir()
        auth.create_certificates(root / "coordinator", "coordinator")
        for name in ("encoder", "denoiser"):
            auth.create_certificates(root / "instances", name)
        # ferry takes a secret certificate only if no one else may read it.
        for secret in root.glob("*/*.key_secret"):
            secret.chmod(0o600)
        yield root


def curve_of(keys: Path, name: str) -> dict:
    """An instance's keywords: its secret certificate, the coordinator's public one."""
    return {
        "curve_key": keys / "instances" / f"{name}.key_secret",
        "curve_peers": keys / "coordinator" / "coordinator.key",
    }


def forge(ctx, endpoint: str) -> int:
    """Plain ZeroMQ, no key: forged messages for a moment; how many went out."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    sent = 0
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        for msg in (b'{"msg_type":"transfer_done","request_id":"r-0"}', b"{not json"):
            try:
                s.send_multipart([b"__transfer__", msg], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                pass
        time.sleep(0.001)
    s.close(0)
    return sent


def test_nodes_hand_off_over_curve_and_a_keyless_stranger_changes_nothing(keys):
    co = tensorferry.Coordinator(
        endpoints=["tcp://127.0.0.1:*", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"],
        curve_key=keys / "coordinator" / "coordinator.key_secret",
        curve_peers=keys / "instances",
        allow_from=["127.0.0.1"],
    )
    enc = tensorferry.Instance("encoder", coordinator=co.endpoint_of("encoder"), endpoint="tcp://127.0.0.1:*",
                         allow_from=["127.0.0.1"], **curve_of(keys, "encoder"))
    den = tensorferry.Instance("denoiser", coordinator=co.endpoint_of("denoiser"), endpoint="tcp://127.0.0.1:*",
                         prealloc=tensorferry.Prealloc(2, 1 << 20), **curve_of(keys, "denoiser"))
    enc.wait_registered(10)
    den.wait_registered(10)
    # What the nodes had set aside before the stranger came (a registration
    # resent while its answer was on its way is ignored as a duplicate).
    before = [enc.stats()["ignored"], den.stats()["ignored"], co.stats()["ignored"]]
    ctx = zmq.Context()
    for endpoint in co.endpoints + [enc.endpoint, den.endpoint]:
        assert forge(ctx, endpoint) > 0
    ctx.term()
    for i in range(8):
        with enc.stage(f"r-{i}", {"x": np.arange(4096, dtype=np.uint16) * (i + 1)}) as st:
            st.commit({"i": i})
        d = den.recv(10)
        assert d is not None
        with d:
            assert d.request_id == f"r-{i}" and d.scalar_fields == {"i": i}
            assert np.array_equal(d.tensors["x"], np.arange(4096, dtype=np.uint16) * (i + 1))
        assert enc.next_outcome(10) == tensorferry.Outcome(f"r-{i}", True, "")
    for _ in range(100):
        if co.stats()["delivered"] == 8:
            break
        time.sleep(0.05)
    # None of the stranger's messages reached a state machine.
    for node in (enc, den):
        assert node.stats()["bad_frames"] == 0, node.stats()
    after = [enc.stats()["ignored"], den.stats()["ignored"], co.stats()["ignored"]]
    assert after == before and co.stats()["delivered"] == 8, (before, after)
    enc.close()
    den.close()
    co.close()


def test_curve_is_refused_where_it_cannot_apply(keys):
    # sglang's head speaks plain ZeroMQ.
    with pytest.raises(ValueError, match="sglang's head"):
        tensorferry.Instance("decoder", coordinator="tcp://127.0.0.1:1", endpoint="tcp://127.0.0.1:*",
                       head="sglang", **curve_of(keys, "encoder"))
    # An instance admits one key: its coordinator's, which it connects with.
    with pytest.raises(ValueError, match="one CURVE key"):
        tensorferry.Instance("encoder", coordinator="tcp://127.0.0.1:1", endpoint="tcp://127.0.0.1:*",
                       curve_key=keys / "instances" / "encoder.key_secret", curve_peers=keys / "instances")
    with pytest.raises(ValueError, match="curve_key is set without curve_peers"):
        tensorferry.Coordinator(endpoints=["tcp://127.0.0.1:*"], pipeline=["encoder"],
                          curve_key=keys / "coordinator" / "coordinator.key_secret")
    # A public certificate is no key pair: the file and what is wrong are named.
    with pytest.raises(ValueError, match=r"coordinator\.key: no `secret-key`"):
        tensorferry.Coordinator(endpoints=["tcp://127.0.0.1:*"], pipeline=["encoder"],
                          curve_key=keys / "coordinator" / "coordinator.key", curve_peers=keys / "instances")
