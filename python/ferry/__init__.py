"""ferry: tensor transfer for disaggregated diffusion serving.

``ferry.TransferEngine`` is a transfer engine with the names of sglang's
``BaseTransferEngine``; ``ferry.sglang.use()`` makes sglang run on it (or,
in every process sglang spawns, ``FERRY_SGLANG=<backend>`` in the
environment: see ``ferry.sglang``).
``ferry.Instance`` and ``ferry.Coordinator`` are ferry's nodes: stage
tensors into slots of a pool and commit them, receive deliveries as
zero-copy views and release them.
"""

from ferry._errors import FerryError
from ferry._engine import ERROR_CODES, TransferEngine
from ferry._native import __version__
from ferry._node import Coordinator, Delivery, Instance, Outcome, Staging


def backends() -> list:
    """The backends ``TransferEngine`` can open in this installation."""
    from ferry import _native

    names = list(_native.backends())
    try:
        import ferry_fabric  # noqa: F401

        names.append("fabric")
    except ImportError:
        pass
    return names


__all__ = [
    "Coordinator",
    "Delivery",
    "ERROR_CODES",
    "FerryError",
    "Instance",
    "Outcome",
    "Staging",
    "TransferEngine",
    "backends",
    "__version__",
]
