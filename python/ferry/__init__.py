"""ferry: tensor transfer for disaggregated diffusion serving.

``ferry.TransferEngine`` is a transfer engine with the names of sglang's
``BaseTransferEngine``; ``ferry.sglang.use()`` makes sglang run on it.
"""

from ferry._errors import FerryError
from ferry._engine import ERROR_CODES, TransferEngine
from ferry._native import __version__


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


__all__ = ["ERROR_CODES", "FerryError", "TransferEngine", "backends", "__version__"]
