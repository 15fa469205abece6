"""ferry's nodes from Python: ``Instance`` (stage tensors into slots of its
pool, receive deliveries as zero-copy views, release them) and
``Coordinator``, over ZeroMQ and ferry's data planes."""

from __future__ import annotations

import atexit
import json
import os
import warnings
import weakref
from types import TracebackType
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Type, TypeVar, Union

from tensorferry import _native
from tensorferry._closing import Closing
from tensorferry._engine import _fabric_module
from tensorferry._stats import CoordinatorStats, InstanceStats

#: numpy's dtype for each of ferry's (sglang's) dtype names; those numpy
#: lacks are viewed as unsigned integers of their size (use ``.torch()``
#: for them).
NUMPY_DTYPES = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "bfloat16": "uint16",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "complex64": "complex64",
    "complex128": "complex128",
}

Spec = Tuple[Sequence[int], str]


def _curve(key: Optional[Union[str, "os.PathLike[str]"]],
           peers: Optional[Union[str, "os.PathLike[str]"]]) -> Dict[str, str]:
    """The native keywords of ``curve_key`` and ``curve_peers``: each
    given one, as a path's text."""
    given = {"curve_key": key, "curve_peers": peers}
    return {k: os.fspath(v) for k, v in given.items() if v is not None}


class Prealloc(NamedTuple):
    """Receive slots an instance sets aside for the fast path:
    ``slots`` slots of ``slot_bytes`` each (``Instance(prealloc=...)``
    takes this or a ``(slots, slot_bytes)`` pair)."""

    slots: int
    slot_bytes: int


_Pair = TypeVar("_Pair", "Prealloc", "Admission")


def _pair(kind: Type[_Pair], value: Any, what: str, expected: str) -> _Pair:
    """``value`` as ``kind`` (a named pair), given as one or as a plain
    pair, checked: the native layer takes it by name. ``what`` names the
    argument in the ``TypeError``, ``expected`` what it takes."""
    if isinstance(value, kind):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise TypeError(f"{what}: expected {expected}, got {value!r}")
    return kind(*value)


def _prealloc(p: Any) -> Prealloc:
    """An instance's ``prealloc``, checked."""
    return _pair(Prealloc, p, "prealloc", "Prealloc(slots, slot_bytes) or a (slots, slot_bytes) pair")


class Admission(NamedTuple):
    """An instance a coordinator lets register: its role and its work
    endpoint (``Coordinator(admitted=...)`` takes these or ``(role,
    endpoint)`` pairs)."""

    role: str
    endpoint: str


def _admission(i: int, a: Any) -> Admission:
    """Entry ``i`` of a coordinator's ``admitted``, checked."""
    return _pair(Admission, a, f"admitted[{i}]", "(role, endpoint)")


class Outcome(NamedTuple):
    """What became of a request this instance staged."""

    request_id: str
    sent: bool
    reason: str


def _dtype_name(x: Any) -> str:
    """ferry's name of a numpy dtype, a torch dtype or a dtype name."""
    name = str(x)
    return name[len("torch."):] if name.startswith("torch.") else getattr(x, "name", name)


def _spec_of(value: Any) -> Tuple[List[int], str]:
    """``(shape, dtype name)`` of a ``(shape, dtype)`` pair, an array or a
    tensor."""
    if isinstance(value, tuple) and len(value) == 2:
        shape, dtype = value
        return [int(d) for d in shape], _dtype_name(dtype)
    return [int(d) for d in value.shape], _dtype_name(value.dtype)


class TensorSpec(NamedTuple):
    """One tensor of a slot: the field it belongs to, its ``index`` in a
    list-valued field (``None`` for a plain field), its ``shape`` and its
    ``dtype`` name. ``Staging.specs`` and ``Delivery.specs`` give them, in
    the slot's order; the native layer takes and gives them in this one
    field order."""

    field: str
    index: Optional[int]
    shape: Tuple[int, ...]
    dtype: str


def _views(native: Any, specs: Iterable[TensorSpec], torch: bool) -> Dict[str, Any]:
    """One view per tensor of the slot, grouped by field (list-valued
    fields become lists ordered by their index).

    numpy arrays hold the slot's buffer export while they (or any view of
    them) live, which is how the slot knows it may not be let go; torch
    tensors are made from them through DLPack, so that they hold it too
    (``torch.frombuffer`` would let the export go at once and keep only the
    pointer).
    """
    import numpy as np

    if torch:
        import torch as _torch
    out: Dict[str, Any] = {}
    for i, (field, index, shape, dtype) in enumerate(specs):
        view: Any = np.frombuffer(native.buffer(i), dtype=NUMPY_DTYPES[dtype]).reshape(list(shape))
        if torch:
            view = _torch.from_dlpack(view)
            wanted = getattr(_torch, dtype)
            if view.dtype != wanted:
                # bfloat16 and the float8 types, which numpy lacks: the
                # same bytes, reinterpreted.
                view = view.view(wanted)
        if index is None:
            out[field] = view
        else:
            out.setdefault(field, []).append((index, view))
    for field, value in out.items():
        if isinstance(value, list):
            out[field] = [v for _, v in sorted(value, key=lambda p: p[0])]
    return out


class _Slot:
    """What a staging and a delivery share: a request's slot and its
    tensors' views."""

    def __init__(self, native: Any, specs: List[TensorSpec]) -> None:
        self._native = native
        self._specs = specs
        self._tensors: Optional[Dict[str, Any]] = None

    @property
    def request_id(self) -> str:
        """The request this slot holds."""
        return self._native.request_id

    @property
    def specs(self) -> List[TensorSpec]:
        """Its tensors' ``TensorSpec``s, in the slot's order (a list-valued
        field's in index order)."""
        return list(self._specs)

    @property
    def tensors(self) -> Dict[str, Any]:
        """Each field's numpy array over the slot (a list of them for a
        list-valued field), zero-copy."""
        if self._tensors is None:
            self._tensors = _views(self._native, self._specs, torch=False)
        return self._tensors

    def torch(self) -> Dict[str, Any]:
        """The tensors as torch tensors over the slot (zero-copy, through
        DLPack). A delivery's must not be written: torch has no read-only
        tensors."""
        return _views(self._native, self._specs, torch=True)


class Staging(_Slot):
    """A slot reserved for one request: fill ``tensors``, then ``commit``.

    ``tensors`` maps each field to a writable numpy array over the slot (a
    list of them for list-valued fields); ``torch()`` gives torch tensors
    over the same bytes. Views must be gone (deleted) before ``commit``,
    ``forward`` or ``abandon``, which otherwise raise ``BufferError``: the
    slot is the sender's until then, and is written out after. Leaving a
    ``with`` block without committing gives the slot back.
    """

    @property
    def data_size(self) -> int:
        """Bytes the slot's data takes (512-byte alignment included)."""
        return self._native.data_size

    def commit(self, scalar_fields: Optional[dict] = None) -> None:
        """Announces the filled slot; ``scalar_fields`` (JSON-serialisable)
        reach the receiver."""
        self._tensors = None
        self._native.commit(json.dumps(scalar_fields or {}))

    def forward(self, delivery: "Delivery", scalar_fields: Optional[dict] = None) -> None:
        """Announces the filled slot as the next leg of ``delivery`` (the
        same request, received here) and releases the delivery: a
        denoiser's forward."""
        self._tensors = None
        delivery._tensors = None
        self._native.forward(delivery._native, json.dumps(scalar_fields or {}))

    def abandon(self) -> None:
        """Gives the slot back without sending."""
        self._tensors = None
        self._native.abandon()

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._native.open:
            self.abandon()


class Delivery(_Slot):
    """A transfer received into this instance's pool.

    ``tensors`` maps each field to a read-only numpy array over the slot,
    zero-copy; ``torch()`` gives torch tensors. ``release()``, ``fail()``
    and leaving a ``with`` block free the slot (and tell the coordinator);
    while any view is alive they raise ``BufferError`` instead, so no view
    can read the slot after it holds another request. Copy what must
    outlive the delivery.
    """

    def __init__(self, native: Any) -> None:
        super().__init__(native, [TensorSpec(f, i, tuple(shape), d) for f, i, shape, d in native.specs()])

    @property
    def scalar_fields(self) -> dict:
        """The sender's scalar fields."""
        return json.loads(self._native.scalar_fields)

    @property
    def manifest(self) -> dict:
        """The manifest as received."""
        return json.loads(self._native.manifest)

    @property
    def is_aborted(self) -> bool:
        """True if the coordinator gave up on the request since it arrived;
        release it all the same."""
        return self._native.is_aborted

    def release(self) -> None:
        """Done with it: the slot is freed and the coordinator told."""
        self._tensors = None
        self._native.release(None)

    def fail(self, reason: str) -> None:
        """Done with it, but it could not be used: ``reason`` goes to the
        coordinator."""
        self._tensors = None
        self._native.release(reason)

    def __enter__(self) -> "Delivery":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._native.held:
            if exc is None:
                self.release()
            else:
                self.fail(f"{exc_type.__name__ if exc_type else 'error'}: {exc}")


TensorsArg = Dict[str, Union[Spec, Any, List[Union[Spec, Any]]]]


class Instance(Closing):
    """A ferry instance: a role's node with a pool, registered with a
    coordinator (ferry's, or sglang's head with ``head="sglang"``).

    Every argument but ``role`` is a keyword. ``coordinator`` is the
    ZeroMQ endpoint it registers at, ``endpoint`` the one it binds for the
    coordinator's messages. ``backend`` names its data plane as
    ``TransferEngine`` and the CLI do: ``"shm"`` (the default: processes
    on this host, through pools in shared memory), ``"local"``
    (processes on this host, by cross-memory attach into a pool of the
    node's own memory), ``"fabric"`` (the ``tensorferry-fabric`` plugin;
    ``provider=``...), ``"verbs"`` (``device=``...) or ``"auto"`` (verbs
    when the host has an RDMA device, else local). ``prealloc``: receive slots set aside for the fast
    path (a ``Prealloc`` or a ``(slots, slot_bytes)`` pair).
    ``head="sglang"`` registers with sglang's head, which may take up to
    ``head_timeout`` seconds to answer a request; ``allow_from``: the IP
    addresses that may connect over tcp (any, when empty). ``curve_key``
    (this node's secret certificate, ``NAME.key_secret``) with
    ``curve_peers`` (its coordinator's public certificate) runs its
    endpoints over CurveZMQ: only the coordinator's key is admitted, and
    messages are encrypted and authenticated (not under sglang's head,
    which speaks plain ZeroMQ: a ``ValueError``). On ``backend="verbs"``,
    ``writers=`` names the certificates of the instances that may write
    into it.

    Errors are ``tensorferry.FerryError`` subclasses: ``RefusedError`` when the
    coordinator refuses the registration, ``FerryTimeoutError`` (a
    ``TimeoutError``) when it does not answer, ``NoRoomError`` when the pool
    has no room for a staging, ``ClosedError`` after ``close()``.
    """

    def __init__(
        self,
        role: str,
        *,
        coordinator: str,
        endpoint: str,
        backend: str = "shm",
        pool_bytes: int = 256 << 20,
        prealloc: Union[Prealloc, Tuple[int, int]] = Prealloc(0, 0),
        min_block: int = 1 << 20,
        head: str = "ferry",
        head_timeout: float = 600.0,
        allow_from: Sequence[str] = (),
        curve_key: Optional[Union[str, "os.PathLike[str]"]] = None,
        curve_peers: Optional[Union[str, "os.PathLike[str]"]] = None,
        **options: Any,
    ) -> None:
        module = _fabric_module() if backend == "fabric" else _native
        prealloc = _prealloc(prealloc)
        self._node = module.InstanceNode(
            role=role,
            coordinator=coordinator,
            endpoint=endpoint,
            backend=backend,
            pool_bytes=pool_bytes,
            prealloc=prealloc,
            min_block=min_block,
            head=head,
            head_timeout=head_timeout,
            allow_from=list(allow_from),
            **_curve(curve_key, curve_peers),
            **options,
        )
        _running.add(self)

    @property
    def role(self) -> str:
        """The role it registered as."""
        return self._node.role

    @property
    def session_id(self) -> str:
        """Its data plane's session id."""
        return self._node.session_id

    @property
    def endpoint(self) -> str:
        """The endpoint the coordinator sends to."""
        return self._node.endpoint

    @property
    def is_registered(self) -> bool:
        """True while the coordinator has it registered (under sglang's
        head: once the registration was sent)."""
        return self._node.is_registered

    def wait_registered(self, timeout: float = 10.0) -> None:
        """Waits until the coordinator accepted the registration; raises
        ``RefusedError`` if it refused (with its reason), ``FerryTimeoutError``
        (a ``TimeoutError``) if it did not answer in ``timeout`` seconds."""
        self._node.wait_registered(timeout)

    def stage(self, request_id: str, tensors: TensorsArg) -> Staging:
        """Reserves a slot for ``request_id`` laid out for ``tensors``:
        field → ``(shape, dtype)``, or an array or tensor (whose bytes are
        copied in), or a list of those for a list-valued field. Raises
        ``NoRoomError`` when the pool has no room now, ``DrainingError``
        once the instance drains."""
        specs: List[TensorSpec] = []
        sources: List[Any] = []
        for field, value in tensors.items():
            items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
            for index, item in items:
                shape, dtype = _spec_of(item)
                specs.append(TensorSpec(field, index, tuple(shape), dtype))
                sources.append(None if isinstance(item, tuple) else item)
        native = self._node.stage(request_id, specs)
        staging = Staging(native, specs)
        if any(src is not None for src in sources):
            views = _views(native, staging._specs, torch=False)
            flat = [v for value in views.values() for v in (value if isinstance(value, list) else [value])]
            for view, src in zip(flat, sources):
                if src is not None:
                    _copy_into(view, src)
            del views, flat, view
        return staging

    def recv(self, timeout: float = 1.0) -> Optional[Delivery]:
        """The next delivery, waiting at most ``timeout`` seconds."""
        native = self._node.recv(timeout)
        return None if native is None else Delivery(native)

    def next_outcome(self, timeout: float = 0.0) -> Optional[Outcome]:
        """What became of the next request this instance staged."""
        o = self._node.next_outcome(timeout)
        return None if o is None else Outcome(*o)

    def next_frame(self, timeout: float = 0.0) -> Optional[Tuple[bytes, bytes]]:
        """The next message that was not a transfer message (a work item
        of the application, such as sglang's head's requests)."""
        return self._node.next_frame(timeout)

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Sends the application's own multipart message to the coordinator
        (sglang's decoder returns its output this way)."""
        self._node.send_frames([bytes(f) for f in frames])

    def stats(self) -> InstanceStats:
        """Its counters and gauges (see ``InstanceStats``)."""
        return self._node.stats()

    def close(self) -> None:
        """Stops the node once no staging or delivery of it is alive."""
        self._node.close()


#: Instances not closed yet: closed at exit, so that their pools (named
#: shared-memory objects) are removed even if the application forgets.
_running: "weakref.WeakSet[Instance]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Closes every instance still running at exit."""
    for inst in list(_running):
        inst.close()


def _copy_into(view: Any, src: Any) -> None:
    """Copies an array or tensor's bytes into a slot view."""
    import numpy as np

    if hasattr(src, "detach") and hasattr(src, "numpy"):  # a torch tensor
        import torch

        src = src.detach().cpu().contiguous()
        if src.dtype in (torch.bfloat16, getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
            src = src.view(torch.uint16 if src.dtype == torch.bfloat16 else torch.uint8)
        src = src.numpy()
    np.copyto(view, np.asarray(src).reshape(view.shape), casting="no")


class Coordinator(Closing):
    """ferry's coordinator: relays the hand-offs between the instances of
    ``pipeline``'s roles, over ZeroMQ. Every argument is a keyword.

    It binds ``endpoints``, one per role, in pipeline order (as sglang's
    head does: a PULL socket cannot name a message's sender, so the
    endpoint a message arrives at tells its role); each instance gives its
    role's endpoint as its ``coordinator``. ``admitted``: the instances
    allowed to register (``Admission`` or ``(role, work endpoint)`` pairs;
    any, when empty; one not listed is not answered, and its
    ``wait_registered`` times out);
    ``allow_from``: the IP addresses that may connect over tcp (any, when
    empty); ``curve_key`` (its secret certificate) with ``curve_peers``
    (a directory of the instances' public certificates, or one) runs its
    endpoints over CurveZMQ, admitting those keys only."""

    def __init__(
        self,
        *,
        endpoints: Sequence[str],
        pipeline: Sequence[str] = ("encoder", "denoiser", "decoder"),
        admitted: Sequence[Union[Admission, Tuple[str, str]]] = (),
        allow_from: Sequence[str] = (),
        curve_key: Optional[Union[str, "os.PathLike[str]"]] = None,
        curve_peers: Optional[Union[str, "os.PathLike[str]"]] = None,
    ) -> None:
        self._pipeline = list(pipeline)
        self._node = _native.CoordinatorNode(
            endpoints=list(endpoints),
            pipeline=self._pipeline,
            admitted=[_admission(i, a) for i, a in enumerate(admitted)],
            allow_from=list(allow_from),
            **_curve(curve_key, curve_peers),
        )

    @property
    def endpoints(self) -> List[str]:
        """The endpoints it bound, one per role, in pipeline order."""
        return self._node.endpoints

    def endpoint_of(self, role: str) -> str:
        """The endpoint instances of ``role`` register at."""
        try:
            return self._node.endpoints[self._pipeline.index(role)]
        except ValueError:
            raise ValueError(f"role {role!r} is not in the pipeline {self._pipeline}") from None

    def stats(self) -> CoordinatorStats:
        """Its figures now (see ``CoordinatorStats``)."""
        return self._node.stats()

    def snapshot(self) -> CoordinatorStats:
        """Deprecated: ``stats()`` (the name ``Instance`` uses)."""
        warnings.warn("Coordinator.snapshot() is deprecated: use stats()", DeprecationWarning, stacklevel=2)
        return self.stats()

    def close(self) -> None:
        """Stops it."""
        self._node.close()
