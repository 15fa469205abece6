"""Running sglang on ferry's transfer engine.

``ferry.sglang.use()`` makes sglang's ``create_transfer_engine`` (sglang
0.5.23, ``sglang.multimodal_gen.runtime.disaggregation.transport.engine``)
return a ferry engine, so that sglang's disaggregated diffusion roles move
their tensors through ferry instead of Mooncake. Call it before sglang
starts its roles (in the process that runs them).
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from ferry._engine import TransferEngine

#: The sglang release this was tested against.
TESTED_SGLANG = "0.5.23"

_ENGINE_MODULE = "sglang.multimodal_gen.runtime.disaggregation.transport.engine"
_USERS = ("sglang.multimodal_gen.runtime.disaggregation.scheduler_mixin",)


def engine_class() -> type:
    """A subclass of sglang's ``BaseTransferEngine`` that runs on a
    ``ferry.TransferEngine`` (for code that checks the type)."""
    base = importlib.import_module(_ENGINE_MODULE).BaseTransferEngine

    class FerryDiffusionEngine(base):  # type: ignore[misc, valid-type]
        """sglang's engine interface over ``ferry.TransferEngine``."""

        def __init__(self, engine: TransferEngine) -> None:
            self.ferry = engine

        # Each member is ferry.TransferEngine's of the same name.
        @property
        def supports_gpu_direct(self) -> bool:
            """False: host memory."""
            return self.ferry.supports_gpu_direct

        @property
        def session_id(self) -> str:
            """What peers pass as ``dst_session_id``."""
            return self.ferry.session_id

        def register_buffer(self, ptr: int, length: int) -> None:
            """Registers ``length`` bytes at ``ptr``."""
            self.ferry.register_buffer(ptr, length)

        def deregister_buffer(self, ptr: int) -> None:
            """Ends the registration at ``ptr``."""
            self.ferry.deregister_buffer(ptr)

        def transfer_sync(self, dst_session_id: str, src_addr: int, dst_addr: int, length: int) -> int:
            """0 once every byte is at the peer, negative on failure."""
            return self.ferry.transfer_sync(dst_session_id, src_addr, dst_addr, length)

        def batch_transfer_sync(self, dst_session_id: str, src_addrs: list, dst_addrs: list, lengths: list) -> int:
            """``transfer_sync`` of the three lists at once."""
            return self.ferry.batch_transfer_sync(dst_session_id, src_addrs, dst_addrs, lengths)

    return FerryDiffusionEngine


def use(backend: str = "auto", **options: Any) -> None:
    """Makes sglang's ``create_transfer_engine`` return a ferry engine on
    ``backend`` (with ``options``, as ``ferry.TransferEngine`` takes them).

    sglang's ``ib_device`` argument, when given, becomes the verbs device
    unless ``options`` name one. Modules that imported the factory by name
    before this call are patched too.
    """
    engine_mod = importlib.import_module(_ENGINE_MODULE)
    cls = engine_class()

    def create_transfer_engine(
        hostname: str = "127.0.0.1",
        gpu_id: int = 0,
        ib_device: Optional[str] = None,
    ) -> Any:
        """sglang's factory, answered with a ferry engine."""
        opts = dict(options)
        if backend == "verbs" and ib_device and "device" not in opts:
            opts["device"] = ib_device
        return cls(TransferEngine(backend, **opts))

    create_transfer_engine.__doc__ = f"ferry's engine on {backend!r} (ferry.sglang.use)"
    engine_mod.create_transfer_engine = create_transfer_engine
    for name in _USERS:
        try:
            user = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(user, "create_transfer_engine"):
            user.create_transfer_engine = create_transfer_engine
