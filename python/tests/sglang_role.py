"""One role of sglang 0.5.23 in its own process: sglang's own
DiffusionTransferManager, TransferTensorBuffer, BuddyAllocator and codec,
unmodified, on ferry's engine (``tensorferry.sglang.use``). Imported by the test
for the receiving role, run as a script for the sending one (commands as
JSON lines on stdin, replies on stdout).

The one change a CPU-only host forces: sglang allocates its pool with
``torch.empty(..., pin_memory=True)``, and pinning needs a CUDA driver. The
buffer module sees a ``torch`` whose ``empty`` drops ``pin_memory``; the
memory is otherwise the same (host memory torch allocates). CUDA streams
and events are not touched: sglang skips them when no device is available
and no stream is passed.
"""

import json
import sys
import types

import torch

import tensorferry.sglang
from procs import reply

ROLE_POOL = 64 << 20


def cpu_only_torch() -> types.ModuleType:
    """torch, with ``empty`` ignoring ``pin_memory`` (no CUDA driver here)."""
    shim = types.ModuleType("torch_without_pinning")
    shim.__dict__.update(torch.__dict__)

    def empty(*args, pin_memory=False, **kwargs):
        return torch.empty(*args, **kwargs)

    shim.empty = empty
    return shim


def manager(role: str, backend: str, options: dict):
    """sglang's transfer manager for ``role``, on ferry's engine."""
    tensorferry.sglang.use(backend, **options)
    from sglang.multimodal_gen.runtime.disaggregation.transport import buffer as buffer_mod
    from sglang.multimodal_gen.runtime.disaggregation.transport import engine as engine_mod
    from sglang.multimodal_gen.runtime.disaggregation.transport.manager import DiffusionTransferManager

    buffer_mod.torch = cpu_only_torch()
    engine = engine_mod.create_transfer_engine(hostname="127.0.0.1", gpu_id=0)
    buf = buffer_mod.TransferTensorBuffer(pool_size=ROLE_POOL, min_block_size=1 << 20, role_name=role, device="cpu")
    return DiffusionTransferManager(engine=engine, buffer=buf)


def tensors(seed: int) -> dict:
    """A request's tensor fields, of several dtypes and shapes, one a list."""
    g = torch.Generator().manual_seed(seed)
    return {
        "latents": torch.randn(2, 4, 64, 64, generator=g, dtype=torch.float32),
        "prompt_embeds": [
            torch.randn(77, 768, generator=g).to(torch.bfloat16),
            torch.randint(-1000, 1000, (3, 5), generator=g, dtype=torch.int64),
        ],
        "mask": torch.rand(1, 333, generator=g) > 0.5,
        "empty": None,
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    mgr = manager("encoder", spec["backend"], spec.get("options", {}))

    reply(ready=True, session=mgr.session_id)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "stage":
            staged, event = mgr.stage_tensors_async(cmd["rid"], tensors(cmd["seed"]), {"step": cmd["seed"]})
            reply(manifest=staged.manifest, data_size=staged.slot.size, event=event is not None)
        elif cmd["op"] == "push":
            ok = mgr.push_to_peer(cmd["rid"], cmd["session"], cmd["addr"], cmd["size"])
            mgr.free_staged(cmd["rid"])
            reply(ok=ok, error=mgr._engine.ferry.last_error)
        elif cmd["op"] == "exit":
            mgr.cleanup()
            reply(ok=True)
            return


if __name__ == "__main__":
    main()
