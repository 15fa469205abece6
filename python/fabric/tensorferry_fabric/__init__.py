"""ferry's libfabric plugin: the engine behind ``tensorferry.TransferEngine(backend="fabric")``.

It is a module of its own because it links libfabric, which ``import tensorferry``
must not need. Use it through ``tensorferry``; this package has no API of its own.
"""

from tensorferry_fabric._native import TransferEngine, backends, __version__

__all__ = ["TransferEngine", "backends", "__version__"]
