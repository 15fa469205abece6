"""ferry: tensor transfer for disaggregated diffusion serving.

``tensorferry.TransferEngine`` is a transfer engine with the names of sglang's
``BaseTransferEngine``, and transfers by handle (``tensorferry.Transfer``),
one-sided reads and notifications for NIXL-style connectors; ``tensorferry.sglang.use()`` makes sglang run on it (or,
in every process sglang spawns, ``FERRY_SGLANG=<backend>`` in the
environment: see ``tensorferry.sglang``).
``tensorferry.Instance`` and ``tensorferry.Coordinator`` are ferry's nodes: stage
tensors into slots of a pool and commit them, receive deliveries as
zero-copy views and release them.

Both name their data planes alike: ``"local"`` (this host, by cross-memory
attach), ``"shm"`` (this host, pools in shared memory: nodes only),
``"fabric"`` (libfabric, with the ``tensorferry-fabric`` plugin), ``"verbs"``
(an RDMA NIC) and ``"auto"`` (verbs if the host has a device, else local).
Every error is a ``tensorferry.FerryError``, of a subclass by kind (``.kind``):
``PeerGoneError``, ``FerryTimeoutError`` (also a ``TimeoutError``),
``RefusedError``... (see ``tensorferry._errors``).
"""

from tensorferry._errors import (
    ClosedError,
    DrainingError,
    FerryError,
    FerryIOError,
    FerryTimeoutError,
    NoRoomError,
    OutOfBoundsError,
    PeerGoneError,
    RefusedError,
    RegistrationError,
    TooLargeError,
    UnknownPeerError,
)
from tensorferry._engine import ERROR_CODES, MAX_NOTIFICATION, Transfer, TransferEngine
from tensorferry._native import END_GRACE, Guard, __version__
from tensorferry._node import Admission, Coordinator, Delivery, Instance, Outcome, Prealloc, Staging, TensorSpec
from tensorferry._stats import CoordinatorStats, InstanceStats


def backends() -> list:
    """The data planes this installation has, ``"auto"`` first: a node runs
    on any of them, ``TransferEngine`` on ``"auto"``, ``"local"``,
    ``"fabric"`` and ``"verbs"``."""
    from tensorferry import _native

    names = list(_native.backends())
    try:
        import tensorferry_fabric  # noqa: F401

        names.append("fabric")
    except ImportError:
        pass
    return names


__all__ = [
    "Admission",
    "ClosedError",
    "Coordinator",
    "CoordinatorStats",
    "Delivery",
    "DrainingError",
    "END_GRACE",
    "ERROR_CODES",
    "FerryError",
    "FerryIOError",
    "FerryTimeoutError",
    "Guard",
    "Instance",
    "MAX_NOTIFICATION",
    "InstanceStats",
    "NoRoomError",
    "Outcome",
    "OutOfBoundsError",
    "PeerGoneError",
    "Prealloc",
    "RefusedError",
    "RegistrationError",
    "Staging",
    "TensorSpec",
    "TooLargeError",
    "Transfer",
    "TransferEngine",
    "UnknownPeerError",
    "backends",
    "__version__",
]
