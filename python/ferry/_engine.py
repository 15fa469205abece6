"""``ferry.TransferEngine``: sglang's ``BaseTransferEngine`` contract."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Dict, List, Optional, Type

from ferry import _native
from ferry._errors import FerryIOError

#: What ``transfer_sync`` and ``batch_transfer_sync`` return, by failure
#: kind (``FerryError.kind``'s names); 0 is success. The core's table
#: (``FaultKind::code``), as the extension module exports it.
ERROR_CODES: Dict[str, int] = dict(_native.FAULT_CODES)


def _fabric_module() -> Any:
    """The libfabric plugin's extension module, or a ``FerryIOError``
    saying how to install it."""
    try:
        import ferry_fabric._native as fabric
    except ImportError as e:
        raise FerryIOError(
            "the fabric backend is ferry's libfabric plugin, which cannot be "
            f"imported here ({e}); install it with `pip install ./python/fabric` "
            "from ferry's repository (it needs libfabric 1.17 or later)"
        ) from e
    return fabric


class TransferEngine:
    """A transfer engine, with the names of sglang's ``BaseTransferEngine``.

    ``backend``: ``"local"`` (processes on this host, any memory they
    registered, by cross-memory attach; the same-host plane, which
    ``ferry.Instance`` names ``"local"`` too), ``"fabric"`` (ferry's libfabric data
    plane; needs the ``ferry-fabric`` plugin), ``"verbs"`` (an RDMA NIC), or
    ``"auto"`` (verbs when the host has an RDMA device, else local).

    Options (keywords): ``timeout`` (seconds a transfer may take, 30: past
    it its writes are ended, and the call returns once they have, so that no
    byte of it moves after any return);
    local: ``threads``, ``parallel_min``; fabric: ``provider`` (``"tcp"``,
    ``"shm"``, ``"efa"``, ``"verbs;ofi_rxm"``, ...), ``source``, ``max_chunk``,
    ``write_timeout``; verbs: ``device``, ``port``, ``gid_index``, ``listen``,
    ``write_timeout``. An option the backend does not take raises
    ``TypeError``.

    Errors are ``ferry.FerryError`` subclasses by kind (a closed engine's
    calls raise ``ClosedError``); the transfers return codes instead.
    Every method may be called from many threads at once; transfers release
    the GIL while they run. A process that only receives makes no calls.
    """

    def __init__(self, backend: str = "auto", **options: Any) -> None:
        module = _fabric_module() if backend == "fabric" else _native
        self._engine = module.TransferEngine(backend, **options)

    @property
    def session_id(self) -> str:
        """What peers pass as ``dst_session_id`` (read it after registering:
        the fabric backend names its regions in it)."""
        return self._engine.session_id

    @property
    def supports_gpu_direct(self) -> bool:
        """False: ferry's engines move host memory."""
        return False

    @property
    def backend(self) -> str:
        """The data plane in use: ``"local"``, ``"fabric"`` or ``"verbs"``."""
        return self._engine.backend

    @property
    def last_error(self) -> Optional[str]:
        """Why this thread's last transfer failed (``None`` after a success)."""
        return self._engine.last_error

    def register_buffer(self, ptr: int, length: int) -> None:
        """Registers ``length`` bytes at address ``ptr`` (a numpy array's
        ``ctypes.data``, a tensor's ``data_ptr()``): peers may write into
        them and this engine may write from them, until deregistered. Keep
        the memory alive meanwhile. Raises ``RegistrationError`` (or
        another ``FerryError``)."""
        self._engine.register_buffer(ptr, length)

    def deregister_buffer(self, ptr: int) -> None:
        """Ends the registration of the region at ``ptr``; once it returns,
        no peer writes into it. Raises ``FerryError``."""
        self._engine.deregister_buffer(ptr)

    def transfer_sync(self, dst_session_id: str, src_addr: int, dst_addr: int, length: int) -> int:
        """Writes ``length`` bytes from ``src_addr`` (in a region registered
        here) to ``dst_addr`` (in one the peer registered). Returns 0 once
        every byte is visible at the peer, a negative ``ERROR_CODES`` value
        on failure, with the reason in ``last_error``."""
        return self._engine.transfer_sync(dst_session_id, src_addr, dst_addr, length)

    def batch_transfer_sync(
        self,
        dst_session_id: str,
        src_addrs: List[int],
        dst_addrs: List[int],
        lengths: List[int],
    ) -> int:
        """``transfer_sync`` of every ``(src, dst, length)`` of the three
        lists at once: 0 when all arrived, negative on any failure."""
        return self._engine.batch_transfer_sync(dst_session_id, src_addrs, dst_addrs, lengths)

    def close(self) -> None:
        """Ends every registration and closes the engine; later calls fail."""
        self._engine.close()

    def __enter__(self) -> "TransferEngine":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._engine)
