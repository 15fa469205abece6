"""sglang 0.5.23's own transfer code on tensorferry.TransferEngine, across two
processes: an encoder stages a request's tensors into its pool, a denoiser
allocates a receive slot in its own, the encoder pushes
(``DiffusionTransferManager.push_to_peer``, which calls ``transfer_sync``),
and the denoiser loads the tensors from the slot. They must arrive byte for
byte. sglang's files are used unmodified (see sglang_role.py for the one
change a CPU-only host forces)."""

import os

import pytest

from procs import LineProcess, required_module

if os.environ.get("FERRY_REQUIRE_SGLANG") != "1":
    pytest.importorskip("sglang.multimodal_gen.runtime.disaggregation.transport.manager")
torch = required_module("torch")

import sglang_role  # noqa: E402


class Encoder(LineProcess):
    """sglang's encoder role in its own process (sglang_role.py)."""

    def __init__(self, backend: str, options: dict) -> None:
        super().__init__("sglang_role.py", {"backend": backend, "options": options})
        assert self.hello["ready"]
        self.session = self.hello["session"]


def same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))


def test_sglang_roles_move_tensors_through_ferry(backend):
    name, options = backend
    encoder = Encoder(name, options)
    try:
        denoiser = sglang_role.manager("denoiser", name, options)
        assert denoiser._engine.ferry.backend == name
        for i, seed in enumerate([11, 12, 13, 14]):
            rid = f"req-{i}"
            staged = encoder.ask(op="stage", rid=rid, seed=seed)
            assert staged["event"] is False
            if i % 2 == 0:
                pending = denoiser.allocate_receive_slot(rid, staged["data_size"])
            else:
                # sglang's fast path: a slot allocated ahead, registered as the receive.
                slot = denoiser._buffer.allocate(staged["data_size"], rid)
                pending = denoiser.register_prealloc_as_receive(rid, slot)
            assert pending is not None
            addr = denoiser.pool_data_ptr + pending.slot.offset
            pushed = encoder.ask(op="push", rid=rid, session=denoiser.session_id, addr=addr, size=staged["data_size"])
            assert pushed["ok"], pushed
            got, event = denoiser.load_tensors_async(rid, staged["manifest"], device="cpu")
            assert event is None
            want = sglang_role.tensors(seed)
            for field, value in want.items():
                if value is None:
                    assert field not in got
                    continue
                assert same(got[field], value), field
            denoiser.free_receive_slot(rid)
        denoiser.cleanup()
    finally:
        encoder.close()
