"""ferry's extension module (Rust). Use it through ``ferry``."""

from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple, Type, final

from tensorferry._node import Admission, Prealloc, TensorSpec
from tensorferry._stats import CoordinatorStats, InstanceStats

__version__: str

#: Each fault kind's name and the code ``transfer_sync`` returns for it
#: (the core's table, ``FaultKind::code``).
FAULT_CODES: Dict[str, int]

#: Every kind an error may have (``FerryError.kind``): the fault kinds,
#: then the others (a node's refusals, anything closed).
ERROR_KINDS: Tuple[str, ...]

#: The longest notification, in bytes.
MAX_NOTIFICATION: int

#: Seconds past a transfer's deadline (or its release) its data plane is
#: given to end its operations: a synchronous call returns by then at the
#: latest (``tensorferry::engine::END_GRACE``).
END_GRACE: float

def backends() -> List[str]:
    """The data planes this module has, ``"auto"`` first."""

@final
class TransferEngine:
    """The native engine behind ``tensorferry.TransferEngine`` (same members)."""

    def __new__(cls, backend: str = "auto", **options: Any) -> "TransferEngine": ...
    @property
    def session_id(self) -> str: ...
    @property
    def supports_gpu_direct(self) -> bool: ...
    @property
    def backend(self) -> str: ...
    @property
    def last_error(self) -> Optional[str]: ...
    def register_buffer(self, ptr: int, length: int) -> None: ...
    def deregister_buffer(self, ptr: int) -> None: ...
    def transfer_sync(self, dst_session_id: str, src_addr: int, dst_addr: int, length: int) -> int: ...
    def batch_transfer_sync(
        self, dst_session_id: str, src_addrs: List[int], dst_addrs: List[int], lengths: List[int]
    ) -> int: ...
    def read_sync(self, src_session_id: str, local_addr: int, remote_addr: int, length: int) -> int: ...
    def batch_read_sync(
        self, src_session_id: str, local_addrs: List[int], remote_addrs: List[int], lengths: List[int]
    ) -> int: ...
    def post_write(
        self,
        dst_session_id: str,
        src_addrs: List[int],
        dst_addrs: List[int],
        lengths: List[int],
        *,
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> "Transfer": ...
    def post_read(
        self,
        src_session_id: str,
        local_addrs: List[int],
        remote_addrs: List[int],
        lengths: List[int],
        *,
        notify: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> "Transfer": ...
    def notify(self, dst_session_id: str, message: bytes) -> None: ...
    def notifications(self) -> List[Tuple[str, bytes]]: ...
    def notification_fd(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> "TransferEngine": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class Guard:
    """Who may connect to a socket, and with which keys: ``allow_from``,
    ``curve_key``, ``curve_peers`` as ``TransferEngine`` takes them (for
    a part not given, the allow-list or CURVE's key and peers, the
    environment's ``FERRY_ALLOW_FROM``, or ``FERRY_CURVE_KEY`` and
    ``FERRY_CURVE_PEERS``). For sockets pyzmq opens
    (vLLM-omni's connector): their authentication handler asks
    ``verdict``, ferry's own handler's answer."""

    def __new__(
        cls,
        *,
        allow_from: Optional[Any] = None,
        curve_key: Optional[Any] = None,
        curve_peers: Optional[Any] = None,
    ) -> "Guard": ...
    @property
    def enforces(self) -> bool: ...
    @property
    def allow_from(self) -> List[str]: ...
    @property
    def curve(self) -> bool: ...
    @property
    def public_key(self) -> Optional[str]: ...
    @property
    def secret_key(self) -> Optional[str]: ...
    @property
    def peers(self) -> List[str]: ...
    def admits_key(self, key: str) -> bool: ...
    def domain(self, endpoint: str) -> Optional[str]: ...
    def verdict(
        self, domain: str, address: str, mechanism: bytes, credentials: bytes
    ) -> Tuple[bool, str]: ...

@final
class Transfer:
    """The native handle behind ``tensorferry.Transfer`` (same members)."""

    @property
    def state(self) -> str: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> "Transfer": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class SlotBuffer:
    """A tensor's bytes in a pool slot, by the buffer protocol (zero-copy).
    Exporting raises once the slot was released."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

@final
class Staging:
    """A reserved slot (``tensorferry.Staging`` wraps it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def data_size(self) -> int: ...
    @property
    def open(self) -> bool: ...
    def buffer(self, i: int) -> SlotBuffer: ...
    def commit(self, scalar_fields: str) -> None: ...
    def forward(self, delivery: "Delivery", scalar_fields: str) -> None: ...
    def abandon(self) -> None: ...

@final
class Delivery:
    """A delivery (``tensorferry.Delivery`` wraps it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def scalar_fields(self) -> str: ...
    @property
    def manifest(self) -> str: ...
    @property
    def is_aborted(self) -> bool: ...
    @property
    def held(self) -> bool: ...
    def specs(self) -> List[Tuple[str, Optional[int], List[int], str]]:
        """The tensors, in ``TensorSpec``'s field order (``field``,
        ``index``, ``shape``, ``dtype``); ``Delivery`` names them."""
    def buffer(self, i: int) -> SlotBuffer: ...
    def release(self, error: Optional[str] = None) -> None: ...

@final
class InstanceNode:
    """An instance (``tensorferry.Instance`` wraps it)."""

    def __new__(
        cls,
        *,
        role: str,
        coordinator: str,
        endpoint: str,
        backend: str = "shm",
        pool_bytes: int = ...,
        prealloc: Optional[Prealloc] = None,
        min_block: int = ...,
        head: str = "ferry",
        head_timeout: float = 600.0,
        allow_from: List[str] = ...,
        curve_key: Optional[str] = None,
        curve_peers: Optional[str] = None,
        **options: Any,
    ) -> "InstanceNode": ...
    @property
    def role(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def is_registered(self) -> bool: ...
    def wait_registered(self, timeout: float) -> None: ...
    def stage(self, request_id: str, specs: List[TensorSpec]) -> Staging:
        """Reserves a slot laid out for ``specs``, read by field name."""
    def recv(self, timeout: float) -> Optional[Delivery]: ...
    def next_outcome(self, timeout: float) -> Optional[Tuple[str, bool, str]]: ...
    def next_frame(self, timeout: float) -> Optional[Tuple[bytes, bytes]]: ...
    def send_frames(self, frames: List[bytes]) -> None: ...
    def stats(self) -> InstanceStats: ...
    def close(self) -> None: ...

@final
class CoordinatorNode:
    """A coordinator (``tensorferry.Coordinator`` wraps it)."""

    def __new__(
        cls,
        *,
        endpoints: List[str],
        pipeline: List[str],
        admitted: List[Admission] = ...,
        allow_from: List[str] = ...,
        curve_key: Optional[str] = None,
        curve_peers: Optional[str] = None,
    ) -> "CoordinatorNode": ...
    @property
    def endpoints(self) -> List[str]: ...
    def stats(self) -> CoordinatorStats: ...
    def close(self) -> None: ...
