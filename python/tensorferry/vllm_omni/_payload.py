"""How a payload lies in a pool region, and how it comes back out.

A region holds a header, then the payload's array leaves, each on a
64-byte boundary: ``[header][pad][leaf 0][pad][leaf 1]...``. The header is
the payload with every torch tensor and numpy array replaced by a marker,
plus a table of the leaves (kind, dtype, shape, offset, size), serialized
with msgpack when it holds only plain values (dicts, lists, strings,
numbers, bytes, None), else with vLLM-omni's own ``OmniSerializer`` (so
that everything else a stage sends, PIL images, dataclasses,
``RequestOutput``, travels as it does through vLLM-omni's other
connectors; it costs some 30 µs more to decode, as it looks for objects to
rebuild). Its first byte says which. The receiver reads the whole region
in one one-sided read and rebuilds the payload with every leaf a zero-copy
view of its own region.

Three shapes of payload: a tensor (comes back as a tensor of the same
dtype and shape), ``bytes``/``bytearray`` (comes back as a ``FerryBuffer``,
vLLM-omni's raw-data path: a uint8 view and ``release()``), and anything
else (comes back as the same structure; tuples stay tuples)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import msgspec
import numpy as np
import torch

from tensorferry.vllm_omni._pool import LeasedArray

LEAF_ALIGN = 64
# numpy's limit; a peer's shape with more is refused, not raised on.
_MAX_DIMS = 32
_LEAF = "__ferry_leaf__"
_TUPLE = "__ferry_tuple__"
_FORMAT = 1

_PLAIN = b"m"  # the header is plain msgpack
_OMNI = b"o"  # the header is OmniSerializer's

KIND_OBJECT = "object"
KIND_TENSOR = "tensor"
KIND_BYTES = "bytes"

#: The torch dtypes a payload may carry: the plain ones (a name from a peer
#: is looked up here, never with ``getattr(torch, name)`` alone).
TORCH_DTYPES: Dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in (
        "float64", "float32", "float16", "bfloat16", "complex64", "complex128",
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    )
    if isinstance(getattr(torch, name, None), torch.dtype)
}


#: Each torch dtype's numpy dtype of the same item size: its own where
#: numpy has it, else an unsigned integer (a view only sees the bytes).
_NUMPY_OF: Dict[torch.dtype, np.dtype] = {
    dtype: np.dtype(
        {
            "float64": np.float64, "float32": np.float32, "float16": np.float16,
            "complex64": np.complex64, "complex128": np.complex128,
            "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
            "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
            "bool": np.bool_,
        }.get(name) or {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
    )
    for name, dtype in TORCH_DTYPES.items()
}


class PayloadError(ValueError):
    """A payload that cannot be sent, or a region that does not hold one."""


def _align(n: int) -> int:
    return (n + LEAF_ALIGN - 1) & ~(LEAF_ALIGN - 1)


@dataclass
class _Leaf:
    kind: str  # "torch" or "numpy"
    value: Any
    dtype: str
    shape: List[int]
    nbytes: int
    offset: int = 0


class Plan:
    """A payload laid out for a region: ``size`` bytes, written by
    ``write``."""

    def __init__(self, header: bytes, leaves: List[_Leaf], data_start: int, size: int) -> None:
        self.header = header
        self.leaves = leaves
        self.data_start = data_start
        self.size = size

    def write(self, region: np.ndarray) -> None:
        """Copies the header and every leaf into ``region`` (uint8, at
        least ``size`` bytes): the payload's one copy on the sending side."""
        region[: len(self.header)] = np.frombuffer(self.header, dtype=np.uint8)
        with torch.no_grad():
            for leaf in self.leaves:
                if leaf.nbytes == 0:
                    continue
                start = self.data_start + leaf.offset
                dst = region[start : start + leaf.nbytes]
                if leaf.kind == "torch" and leaf.value.device.type == "cpu" and leaf.value.is_contiguous():
                    # numpy's copy: one thread, where torch's copy_ wakes
                    # its intra-op pool (slower for megabytes on a busy host).
                    dst[:] = leaf.value.reshape(-1).view(torch.uint8).numpy()
                elif leaf.kind == "torch":
                    target = torch.from_numpy(dst).view(leaf.value.dtype).view(leaf.value.shape)
                    target.copy_(leaf.value)
                else:
                    np.copyto(dst.view(leaf.value.dtype).reshape(leaf.value.shape), leaf.value)


def plan(data: Any, serialize: Callable[[Any], bytes]) -> Plan:
    """Lays ``data`` out: its leaves found, the header serialized with
    ``serialize`` (vLLM-omni's ``OmniSerializer.serialize``). Raises
    ``PayloadError`` for a tensor ferry cannot move (sparse, quantized,
    nested) or an empty payload, and what ``serialize`` raises for a value
    it cannot serialize."""
    leaves: List[_Leaf] = []
    plain = [True]
    if isinstance(data, torch.Tensor):
        kind = KIND_TENSOR
        body: Any = _leaf_of(data, leaves, "payload")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        kind = KIND_BYTES
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size == 0:
            raise PayloadError("an empty bytes payload: nothing to send")
        body = _leaf_of(raw, leaves, "payload")
    else:
        kind = KIND_OBJECT
        body = _skeleton(data, leaves, "payload", plain)
    offset = 0
    for leaf in leaves:
        leaf.offset = offset
        offset = _align(offset + leaf.nbytes)
    table = [[leaf.kind, leaf.dtype, leaf.shape, leaf.offset, leaf.nbytes] for leaf in leaves]
    fields = {"ferry": _FORMAT, "kind": kind, "leaves": table, "body": body}
    header = _PLAIN + msgspec.msgpack.encode(fields) if plain[0] else _OMNI + serialize(fields)
    data_start = _align(len(header))
    return Plan(header, leaves, data_start, data_start + offset)


def _leaf_of(value: Any, leaves: List[_Leaf], path: str) -> Dict[str, int]:
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or getattr(value, "is_nested", False):
            raise PayloadError(f"{path}: a {value.layout} tensor (ferry moves dense tensors)")
        name = str(value.dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            raise PayloadError(f"{path}: dtype {value.dtype} is not one ferry moves")
        leaf = _Leaf("torch", value.detach(), name, list(value.shape), value.numel() * value.element_size())
    else:
        leaf = _Leaf("numpy", value, value.dtype.str, list(value.shape), int(value.nbytes))
    leaves.append(leaf)
    return {_LEAF: len(leaves) - 1}


_PLAIN_TYPES = (str, int, float, bool, bytes, type(None))


def _skeleton(value: Any, leaves: List[_Leaf], path: str, plain: List[bool]) -> Any:
    if isinstance(value, torch.Tensor):
        return _leaf_of(value, leaves, path)
    if isinstance(value, np.ndarray) and value.dtype.kind not in ("O", "V"):
        return _leaf_of(value, leaves, path)
    if isinstance(value, dict):
        if not all(type(k) in (str, int) for k in value):
            plain[0] = False
        return {k: _skeleton(v, leaves, f"{path}[{k!r}]", plain) for k, v in value.items()}
    if isinstance(value, tuple):
        return {_TUPLE: [_skeleton(v, leaves, f"{path}[{i}]", plain) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_skeleton(v, leaves, f"{path}[{i}]", plain) for i, v in enumerate(value)]
    if type(value) not in _PLAIN_TYPES:
        # Enums, images, dataclasses, RequestOutput...: vLLM-omni's
        # serializer decides what they become.
        plain[0] = False
    return value


class FerryBuffer:
    """A received raw-data payload: ``tensor`` is a zero-copy uint8 view of
    it, in the receiving connector's pool. ``release()`` says the caller is
    done with it; its memory returns to the pool once no view of it (this
    one or any made from it) is alive, so a view kept past ``release`` stays
    valid. vLLM-omni's raw-data consumers (``.tensor``, ``.release()``) take
    it as they take a ``ManagedBuffer``."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor: Optional[torch.Tensor] = tensor
        self.size = tensor.numel()

    @property
    def tensor(self) -> torch.Tensor:
        """The bytes, as a 1-D uint8 tensor (zero-copy)."""
        if self._tensor is None:
            raise ValueError("FerryBuffer: released")
        return self._tensor

    def as_tensor(self, dtype: torch.dtype, shape: Tuple[int, ...]) -> torch.Tensor:
        """The bytes as a tensor of ``dtype`` and ``shape`` (zero-copy)."""
        return self.tensor.view(dtype).view(shape)

    def to_bytes(self) -> bytes:
        """A copy of the bytes."""
        return self.tensor.numpy().tobytes()

    def release(self) -> None:
        """Drops this buffer's view; may be called again."""
        self._tensor = None

    def __len__(self) -> int:
        return self.size

    def __enter__(self) -> "FerryBuffer":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.release()


def decode(region: LeasedArray, header_len: int, data_start: int, deserialize: Callable[[bytes], Any]) -> Any:
    """The payload in ``region`` (a leased view of what was read), its
    leaves zero-copy views of ``region``. Everything in the region came from
    a peer: a header that does not describe leaves inside the region, with
    dtypes and shapes that fit them, raises ``PayloadError``, and so does
    anything else the header makes fail (a nesting too deep to rebuild, a
    shape torch refuses)."""
    try:
        return _decode(region, header_len, data_start, deserialize)
    except PayloadError:
        raise
    except Exception as e:
        raise PayloadError(f"{type(e).__name__}: {e}") from e


def _decode(region: LeasedArray, header_len: int, data_start: int, deserialize: Callable[[bytes], Any]) -> Any:
    if data_start % LEAF_ALIGN:
        raise PayloadError(f"data at {data_start}, not on a {LEAF_ALIGN}-byte boundary")
    if not 0 < header_len <= data_start <= len(region):
        raise PayloadError(f"header of {header_len} bytes, data at {data_start}, in a region of {len(region)}")
    raw = region[:header_len].tobytes()
    try:
        if raw[:1] == _PLAIN:
            header = msgspec.msgpack.decode(raw[1:])
        elif raw[:1] == _OMNI:
            header = deserialize(raw[1:])
        else:
            raise PayloadError(f"header codec {raw[:1]!r}")
    except PayloadError:
        raise
    except Exception as e:
        raise PayloadError(f"header does not decode: {e}") from e
    if not isinstance(header, dict) or header.get("ferry") != _FORMAT:
        raise PayloadError(f"header is not ferry's format {_FORMAT}")
    table = header.get("leaves")
    if not isinstance(table, list):
        raise PayloadError("header has no leaf table")
    space = len(region) - data_start
    # Leaves are cut from a plain view, whose base (the leased view) holds
    # the region: slicing the leased view itself would run its Python
    # ``__array_finalize__`` at every step.
    plain = region.view(np.ndarray)
    leaves: List[Any] = []
    for i, entry in enumerate(table):
        if not (isinstance(entry, list) and len(entry) == 5):
            raise PayloadError(f"leaf {i}: malformed entry")
        kind, dtype, shape, offset, nbytes = entry
        if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise PayloadError(f"leaf {i}: shape {shape!r}")
        if not (isinstance(offset, int) and isinstance(nbytes, int) and 0 <= offset and 0 <= nbytes):
            raise PayloadError(f"leaf {i}: offset {offset!r}, size {nbytes!r}")
        if offset % LEAF_ALIGN or offset + nbytes > space:
            raise PayloadError(f"leaf {i}: {nbytes} bytes at {offset} outside the {space} of the region")
        start = data_start + offset
        if kind == "torch":
            tdtype = TORCH_DTYPES.get(dtype) if isinstance(dtype, str) else None
            if tdtype is None:
                raise PayloadError(f"leaf {i}: torch dtype {dtype!r}")
            itemsize = tdtype.itemsize
            _check_size(i, shape, itemsize, nbytes)
            if nbytes == 0:
                leaves.append(torch.empty(shape, dtype=tdtype))
                continue
            # Sliced and shaped by numpy (a torch op costs microseconds):
            # as the numpy dtype of the same size, then seen as the torch
            # one where numpy has none (bfloat16, float8).
            same_size = _NUMPY_OF[tdtype]
            tensor = torch.from_numpy(plain[start : start + nbytes].view(same_size).reshape(shape))
            leaves.append(tensor if tensor.dtype == tdtype else tensor.view(tdtype))
        elif kind == "numpy":
            try:
                ndtype = np.dtype(dtype)
            except (TypeError, ValueError) as e:
                raise PayloadError(f"leaf {i}: numpy dtype {dtype!r}") from e
            if ndtype.kind in ("O", "V") or ndtype.itemsize == 0:
                raise PayloadError(f"leaf {i}: numpy dtype {dtype!r} is not plain data")
            _check_size(i, shape, ndtype.itemsize, nbytes)
            # A plain ndarray, whose base (the leased view) holds the region.
            leaves.append(plain[start : start + nbytes].view(ndtype).reshape(shape))
        else:
            raise PayloadError(f"leaf {i}: kind {kind!r}")
    kind = header.get("kind")
    body = _rebuild(header.get("body"), leaves)
    if kind == KIND_OBJECT:
        return body
    if not isinstance(body, (torch.Tensor, np.ndarray)):
        raise PayloadError(f"a {kind} payload without its leaf")
    if kind == KIND_TENSOR and isinstance(body, torch.Tensor):
        return body
    if kind == KIND_BYTES and isinstance(body, np.ndarray) and body.dtype == np.uint8 and body.ndim == 1:
        return FerryBuffer(torch.from_numpy(body))
    raise PayloadError(f"payload kind {kind!r} does not match its leaf")


def _check_size(i: int, shape: List[int], itemsize: int, nbytes: int) -> None:
    if math.prod(shape) * itemsize != nbytes:
        raise PayloadError(f"leaf {i}: shape {shape} of {itemsize}-byte items is not {nbytes} bytes")


def _rebuild(value: Any, leaves: List[Any]) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            if _LEAF in value:
                index = value[_LEAF]
                if not (isinstance(index, int) and 0 <= index < len(leaves)):
                    raise PayloadError(f"leaf reference {index!r} of {len(leaves)}")
                return leaves[index]
            if _TUPLE in value and isinstance(value[_TUPLE], list):
                return tuple(_rebuild(v, leaves) for v in value[_TUPLE])
        return {k: _rebuild(v, leaves) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild(v, leaves) for v in value]
    return value
