"""ferry's libfabric plugin (Rust): the same classes as ``tensorferry._native``,
built with the libfabric data plane. Use it through ``ferry``."""

from tensorferry._native import (
    ERROR_KINDS as ERROR_KINDS,
    FAULT_CODES as FAULT_CODES,
    CoordinatorNode as CoordinatorNode,
    Delivery as Delivery,
    InstanceNode as InstanceNode,
    MAX_NOTIFICATION as MAX_NOTIFICATION,
    SlotBuffer as SlotBuffer,
    Staging as Staging,
    Transfer as Transfer,
    TransferEngine as TransferEngine,
    __version__ as __version__,
    backends as backends,
)
