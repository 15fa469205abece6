"""ferry's nodes from Python: an encoder in another process hands
requests to a denoiser in this one through a ferry coordinator, every byte
checked; the views' lifetime rules; work items and frames."""

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import tensorferry
from procs import required_module

HERE = Path(__file__).resolve().parent
torch = required_module("torch")

import node_peer  # noqa: E402

NODE_BACKENDS = [
    ("shm", "shm", {}),
    ("local", "local", {}),
    ("fabric-tcp", "fabric", {"provider": "tcp;ofi_rxm"}),
]


@pytest.fixture
def ipc():
    """ipc:// endpoints in a directory of their own, removed after."""
    with tempfile.TemporaryDirectory(prefix="ferry-py-") as d:
        yield lambda name: f"ipc://{d}/{name}"


@pytest.fixture
def coordinator(ipc):
    co = tensorferry.Coordinator(endpoints=[ipc("co-encoder"), ipc("co-denoiser"), ipc("co-decoder")])
    yield co
    co.close()


def same(got, want) -> bool:
    if isinstance(want, list):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
    if isinstance(want, np.ndarray):
        want = torch.from_numpy(want)
    return got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape) and got.view(torch.uint8).equal(want.contiguous().view(torch.uint8))


@pytest.mark.parametrize("backend", NODE_BACKENDS, ids=[b[0] for b in NODE_BACKENDS])
def test_an_encoder_process_hands_requests_to_this_denoiser(backend, coordinator, ipc):
    _, name, options = backend
    count = 12
    den = tensorferry.Instance("denoiser", coordinator=coordinator.endpoint_of("denoiser"), endpoint=ipc("den"), backend=name,
                         prealloc=tensorferry.Prealloc(2, 1 << 20), **options)
    # The plane named is the plane run: its session id says which.
    assert den.session_id.startswith({"shm": "shm:", "local": "local:"}.get(name, "")), den.session_id
    den.wait_registered(10)
    spec = {"coordinator": coordinator.endpoint_of("encoder"), "endpoint": ipc("enc"), "backend": name,
            "options": options, "count": count}
    enc = subprocess.Popen([sys.executable, str(HERE / "node_peer.py"), json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    seen = set()
    try:
        while len(seen) < count:
            d = den.recv(30)
            assert d is not None, f"only {sorted(seen)} arrived"
            with d:
                i = d.scalar_fields["i"]
                assert d.request_id == f"req-{i}" and d.scalar_fields["note"] == "from the encoder"
                want = node_peer.tensors(i)
                got = d.torch()
                for field, value in want.items():
                    assert same(got[field], value), (i, field)
                # numpy views of the same bytes, read-only.
                arr = d.tensors["latents"]
                assert not arr.flags.writeable
                assert np.array_equal(arr, want["latents"])
                assert d.manifest["latents"][0]["shape"] == [2, 4, 32, 32]
                del got, arr
            seen.add(i)
        out, _ = enc.communicate(timeout=60)
    finally:
        if enc.poll() is None:
            enc.kill()
            enc.wait()
    report = json.loads(out)
    assert report["sent"] == count, report
    stats = den.stats()
    assert stats["received"] == count and stats["released"] == count
    assert stats["requests_held"] == 0
    snap = coordinator.stats()
    assert snap["delivered"] == count and snap["failed"] == 0
    den.close()


def pair(coordinator, ipc, **den_options):
    enc = tensorferry.Instance("encoder", coordinator=coordinator.endpoint_of("encoder"), endpoint=ipc("enc"))
    den = tensorferry.Instance("denoiser", coordinator=coordinator.endpoint_of("denoiser"), endpoint=ipc("den"), **den_options)
    enc.wait_registered(10)
    den.wait_registered(10)
    return enc, den


def test_views_cannot_outlive_their_slot(coordinator, ipc):
    enc, den = pair(coordinator, ipc)
    st = enc.stage("r1", {"x": ((4, 4), "float32"), "y": [((3,), "int16")]})
    x = st.tensors["x"]
    assert x.flags.writeable and st.data_size == 1024
    x[:] = 2.5
    st.tensors["y"][0][:] = [1, 2, 3]
    # A writable view alive: the slot is still the application's.
    with pytest.raises(BufferError, match="1 view"):
        st.commit({"k": 1})
    del x
    st.commit({"k": 1})
    with pytest.raises(tensorferry.FerryError, match="committed or given back already"):
        st.commit()
    d = den.recv(10)
    assert d is not None and d.scalar_fields == {"k": 1}
    got = d.tensors["x"]
    t = d.torch()["y"][0]
    assert got.tolist() == [[2.5] * 4] * 4 and t.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="read-only"):
        got[0, 0] = 1
    buf = d._native.buffer(0)
    # numpy and torch (DLPack) views both hold the slot.
    with pytest.raises(BufferError, match="2 view"):
        d.release()
    del got
    with pytest.raises(BufferError, match="1 view"):
        d.release()
    del t
    gc.collect()
    d.release()
    assert not d._native.held
    # The slot is gone: no new view of it.
    with pytest.raises(BufferError, match="was released"):
        memoryview(buf)
    with pytest.raises(tensorferry.FerryError, match="released already"):
        d.release()
    assert enc.next_outcome(10) == tensorferry.Outcome("r1", True, "")
    enc.close()
    den.close()


def test_with_blocks_release_fail_and_give_back(coordinator, ipc):
    enc, den = pair(coordinator, ipc)
    held = enc.stats()["live_slots"]
    with enc.stage("dropped", {"x": ((16,), "uint8")}) as st:
        st.tensors["x"][:] = 1
    assert enc.stats()["live_slots"] == held and enc.stats()["requests_held"] == 0
    for rid in ("ok", "bad"):
        with enc.stage(rid, {"x": np.full(16, 7, dtype=np.uint8)}) as st:
            st.commit()
    for _ in range(2):
        d = den.recv(10)
        try:
            with d:
                assert d.tensors["x"].tolist() == [7] * 16
                if d.request_id == "bad":
                    raise RuntimeError("the model could not use it")
        except RuntimeError:
            pass
        assert not d._native.held
    assert den.stats()["released"] == 2 and den.stats()["requests_held"] == 0
    # The coordinator hears of both endings a moment later.
    for _ in range(50):
        snap = coordinator.stats()
        if snap["delivered"] + snap["failed"] == 2:
            break
        time.sleep(0.1)
    assert snap["failed"] == 1 and snap["delivered"] == 1, snap
    enc.close()
    den.close()


def test_a_staging_and_its_delivery_name_their_tensors_alike(coordinator, ipc):
    enc, den = pair(coordinator, ipc)
    TensorSpec = tensorferry.TensorSpec
    want = [TensorSpec("x", None, (4, 4), "float32"),
            TensorSpec("y", 0, (3,), "int16"),
            TensorSpec("y", 1, (2,), "uint8")]
    with enc.stage("r", {"x": ((4, 4), "float32"), "y": [((3,), "int16"), np.zeros(2, dtype=np.uint8)]}) as st:
        assert st.specs == want
        st.commit()
    d = den.recv(10)
    assert d is not None
    with d:
        # One type, one field order, both ways.
        assert d.specs == want and all(type(s) is TensorSpec for s in d.specs)
        assert [s.field for s in d.specs] == ["x", "y", "y"] and d.specs[1].index == 0 and d.specs[0].shape == (4, 4)
        assert [tuple(t) for t in d._native.specs()] == [(f, i, list(shape), dt) for f, i, shape, dt in want]
    # The native layer reads a spec by its names, not by its place.
    native = enc._node.stage("named", [TensorSpec(dtype="uint8", shape=(8,), index=None, field="z")])
    assert native.data_size == 512
    native.abandon()
    with pytest.raises(TypeError, match=r"specs\[0\]: expected tensorferry.TensorSpec\(field, index, shape, dtype\)"):
        enc._node.stage("unnamed", [("z", None, [8], "uint8")])
    assert enc.stats()["requests_held"] == 0
    enc.close()
    den.close()


def test_prealloc_is_named_and_a_pair_is_taken_too(coordinator, ipc):
    for i, prealloc in enumerate((tensorferry.Prealloc(slots=2, slot_bytes=1 << 20), (2, 1 << 20))):
        den = tensorferry.Instance("denoiser", coordinator=coordinator.endpoint_of("denoiser"), endpoint=ipc(f"den{i}"),
                                   prealloc=prealloc)
        den.wait_registered(10)
        assert den.stats()["prealloc_slots"] == 2, prealloc
        den.close()
    with pytest.raises(TypeError, match=r"prealloc: expected Prealloc\(slots, slot_bytes\)"):
        tensorferry.Instance("denoiser", coordinator=coordinator.endpoint_of("denoiser"), endpoint=ipc("den-bad"),
                             prealloc=(2,))
    # The native layer reads it by its names: a bare pair is not enough.
    with pytest.raises(TypeError, match=r"prealloc: expected tensorferry.Prealloc\(slots, slot_bytes\)"):
        tensorferry._native.InstanceNode(role="denoiser", coordinator=coordinator.endpoint_of("denoiser"),
                                         endpoint=ipc("den-native"), prealloc=(2, 1 << 20))


def test_refusals_and_bad_arguments_are_named(coordinator, ipc):
    odd = tensorferry.Instance("overlord", coordinator=coordinator.endpoint_of("encoder"), endpoint=ipc("odd"))
    with pytest.raises(tensorferry.FerryError, match="unknown role") as refused:
        odd.wait_registered(10)
    assert isinstance(refused.value, tensorferry.RefusedError) and refused.value.kind == "refused"
    odd.close()
    with pytest.raises(ValueError, match="one endpoint per role"):
        tensorferry.Coordinator(endpoints=[ipc("only")])
    enc = tensorferry.Instance("encoder", coordinator=coordinator.endpoint_of("encoder"), endpoint=ipc("enc"))
    with pytest.raises(ValueError, match="unknown dtype"):
        enc.stage("r", {"x": ((4,), "float128")})
    for name in ("local", "shm"):
        with pytest.raises(TypeError, match='takes no option "provider"'):
            tensorferry.Instance("encoder", coordinator=coordinator.endpoint_of("encoder"), endpoint=ipc("enc2"),
                           backend=name, provider="tcp")
    # One vocabulary: a node and the engine name their data planes alike
    # ("local" is cross-memory attach for both, "shm" shared-memory pools,
    # which only a node has).
    with pytest.raises(ValueError, match=r'backend "carrier-pigeon".*auto, local, shm'):
        tensorferry.Instance("encoder", coordinator=coordinator.endpoint_of("encoder"), endpoint=ipc("enc3"),
                       backend="carrier-pigeon")
    with pytest.raises(tensorferry.FerryError, match='shm data plane cannot serve the transfer engine.*local data plane'):
        tensorferry.TransferEngine("shm")
    enc.close()
    with pytest.raises(tensorferry.FerryError, match="closed") as closed:
        enc.stats()
    assert isinstance(closed.value, tensorferry.ClosedError) and closed.value.kind == "closed"


def test_a_coordinator_admits_only_the_instances_it_names(ipc):
    listed = ipc("den-listed")
    co = tensorferry.Coordinator(endpoints=[ipc("a-encoder"), ipc("a-denoiser"), ipc("a-decoder")],
                                 admitted=[tensorferry.Admission(role="denoiser", endpoint=listed),
                                           ("encoder", ipc("enc-listed"))])
    try:
        den = tensorferry.Instance("denoiser", coordinator=co.endpoint_of("denoiser"), endpoint=listed)
        den.wait_registered(10)
        den.close()
        # The right role at another endpoint, and a listed endpoint under
        # another role: neither registers. Neither is answered either (the
        # answer would go to an endpoint nobody vouched for): the coordinator
        # drops the registration, and the instance's wait runs out.
        for role, endpoint in (("denoiser", ipc("den-other")), ("decoder", ipc("enc-listed"))):
            ignored = co.stats()["ignored"]
            odd = tensorferry.Instance(role, coordinator=co.endpoint_of(role), endpoint=endpoint)
            with pytest.raises(tensorferry.FerryTimeoutError):
                odd.wait_registered(1)
            assert not odd.is_registered
            assert co.stats()["ignored"] > ignored
            assert co.stats()["members"] == 0
            odd.close()
    finally:
        co.close()
    with pytest.raises(TypeError, match=r"admitted\[0\]: expected \(role, endpoint\)"):
        tensorferry.Coordinator(endpoints=[ipc("b-encoder"), ipc("b-denoiser"), ipc("b-decoder")],
                                admitted=[("denoiser",)])
    # The native layer reads an admission by its names: a bare pair is not
    # enough (the Python layer names it).
    with pytest.raises(TypeError, match=r"admitted\[0\]: expected tensorferry.Admission\(role, endpoint\)"):
        tensorferry._native.CoordinatorNode(endpoints=[ipc("c-encoder"), ipc("c-denoiser"), ipc("c-decoder")],
                                            pipeline=["encoder", "denoiser", "decoder"],
                                            admitted=[("denoiser", ipc("den-listed"))])


def test_work_items_and_frames_pass_through(ipc):
    zmq = required_module("zmq")
    ctx = zmq.Context()
    head = ctx.socket(zmq.PULL)
    head_ep = ipc("head")
    head.bind(head_ep)
    inst = tensorferry.Instance("decoder", coordinator=head_ep, endpoint=ipc("dec"), head="sglang")
    # sglang's head never acknowledges: the registration counts once sent.
    inst.wait_registered(10)
    frames = head.recv_multipart()
    assert frames[0] == b"__transfer__" and json.loads(frames[1])["msg_type"] == "transfer_register"
    work = ctx.socket(zmq.PUSH)
    work.connect(inst.endpoint)
    work.send_multipart([b"req-9", b"pickled work item"])
    assert inst.next_frame(10) == (b"req-9", b"pickled work item")
    inst.send_frames([b'{"output": "tensor"}', b"\x01\x02\x03"])
    assert head.recv_multipart() == [b'{"output": "tensor"}', b"\x01\x02\x03"]
    assert inst.next_frame(0.0) is None
    inst.close()
    work.close(0)
    head.close(0)
    ctx.term()


def test_a_denoiser_forwards_to_the_decoder(coordinator, ipc):
    enc, den = pair(coordinator, ipc)
    dec = tensorferry.Instance("decoder", coordinator=coordinator.endpoint_of("decoder"), endpoint=ipc("dec"))
    dec.wait_registered(10)
    with enc.stage("r", {"latents": np.arange(64, dtype=np.float32)}) as st:
        st.commit({"step": 0})
    d = den.recv(10)
    latents = d.tensors["latents"] * 2
    nxt = den.stage("r", {"latents": latents})
    view = nxt.tensors["latents"]
    # Views of either side alive: refused, and both are left as they were.
    with pytest.raises(BufferError, match="cannot forward request r: 1 view"):
        nxt.forward(d, {"step": 1})
    del view
    assert d._native.held and nxt._native.open
    nxt.forward(d, {"step": 1})
    assert not d._native.held and not nxt._native.open
    out = dec.recv(10)
    assert out.scalar_fields == {"step": 1}
    assert np.array_equal(out.tensors["latents"], np.arange(64, dtype=np.float32) * 2)
    out.release()
    assert den.stats()["forwarded"] == 1
    for n in (enc, den, dec):
        n.close()
