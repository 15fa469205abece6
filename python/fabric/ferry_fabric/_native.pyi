"""ferry's libfabric plugin (Rust): the same classes as ``ferry._native``,
built with the libfabric data plane. Use it through ``ferry``."""

from ferry._native import (
    CoordinatorNode as CoordinatorNode,
    InstanceNode as InstanceNode,
    Received as Received,
    SlotBuffer as SlotBuffer,
    Staged as Staged,
    TransferEngine as TransferEngine,
    __version__ as __version__,
    backends as backends,
)
