"""vLLM-omni on ferry: ``FerryConnector``, an ``OmniConnectorBase`` that
moves stage payloads through ferry's transfer engine.

Installing ferry's wheel into vLLM-omni's environment is all it takes:
the wheel's ``vllm.general_plugins`` entry point (``tensorferry``; vLLM's ``VLLM_PLUGINS`` allow-list goes by that name) runs
``register()`` in every process vLLM and vLLM-omni start, which adds
``FerryConnector`` to vLLM-omni's connector factory. A stage config then
names it::

    connectors:
      ferry:
        name: FerryConnector
        extra: {backend: local, pool_size: 1073741824}

This module imports neither vLLM nor torch until a connector is made, so
the plugin costs nothing in processes that never make one."""

from __future__ import annotations

import logging
from typing import Any, Dict

#: The name vLLM-omni's configs give the connector.
CONNECTOR_NAME = "FerryConnector"

logger = logging.getLogger("tensorferry.vllm_omni")


def _create(config: Dict[str, Any]) -> Any:
    from tensorferry.vllm_omni._connector import FerryConnector

    return FerryConnector(config)


def register() -> None:
    """Adds ``FerryConnector`` to vLLM-omni's connector factory. Idempotent
    (plugins load once per process, but vLLM and vLLM-omni both load the
    general group); does nothing where vLLM-omni is not installed, since
    plain vLLM loads the group too."""
    try:
        from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
    except ImportError:
        logger.debug("vLLM-omni is not installed: FerryConnector not registered")
        return
    if CONNECTOR_NAME not in OmniConnectorFactory.list_registered_connectors():
        OmniConnectorFactory.register_connector(CONNECTOR_NAME, _create)


def __getattr__(name: str) -> Any:
    # The connector and its buffer type import vLLM-omni and torch: only
    # when asked for.
    if name == "FerryConnector":
        from tensorferry.vllm_omni._connector import FerryConnector

        return FerryConnector
    if name == "FerryBuffer":
        from tensorferry.vllm_omni._payload import FerryBuffer

        return FerryBuffer
    raise AttributeError(f"module 'tensorferry.vllm_omni' has no attribute {name!r}")


__all__ = ["CONNECTOR_NAME", "FerryBuffer", "FerryConnector", "register"]
