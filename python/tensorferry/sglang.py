"""Running sglang on ferry's transfer engine.

sglang 0.5.23's disaggregated diffusion roles get their transfer engine from
one factory, ``create_transfer_engine`` in
``sglang.multimodal_gen.runtime.disaggregation.transport.engine`` (which
``...disaggregation.scheduler_mixin`` imports by name). Pointing that name
at a factory that answers with a ferry engine makes the roles move their
tensors through ferry instead of Mooncake, with sglang's files unmodified.
There are two ways to get there, and both go through ``patch()`` below:

* ``tensorferry.sglang.use(backend, **options)``: code that runs in the process
  that creates the engine calls it.
* Configuration: ``FERRY_SGLANG=<backend>`` (and ``FERRY_SGLANG_OPTIONS``,
  a JSON object of options) in the environment. sglang starts its role
  workers with multiprocessing's *spawn* context, so a call made in the
  launcher never reaches them; the variables do, since children inherit the
  environment. The wheel's ``tensorferry_sglang.pth`` installs an import hook
  (``_tensorferry_sglang``, a top-level module of the wheel) in every interpreter
  that starts with ``FERRY_SGLANG`` set, and the hook calls
  ``use_environment()`` when sglang imports its engine module.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Tuple

from tensorferry._engine import TransferEngine

#: The sglang release this was tested against.
TESTED_SGLANG = "0.5.23"

#: The environment variable naming the backend (see ``use_environment``).
BACKEND_VARIABLE = "FERRY_SGLANG"
#: The environment variable holding the engine's options, a JSON object.
OPTIONS_VARIABLE = "FERRY_SGLANG_OPTIONS"
#: The backend names ``tensorferry.TransferEngine`` takes.
BACKENDS = ("local", "fabric", "verbs", "auto")

_ENGINE_MODULE = "sglang.multimodal_gen.runtime.disaggregation.transport.engine"
_USERS = ("sglang.multimodal_gen.runtime.disaggregation.scheduler_mixin",)

_log = logging.getLogger("tensorferry.sglang")
_announced = False


def engine_class(engine_module: Optional[ModuleType] = None) -> type:
    """A subclass of sglang's ``BaseTransferEngine`` that runs on a
    ``tensorferry.TransferEngine`` (for code that checks the type).

    ``engine_module`` is sglang's engine module (imported when not given)."""
    if engine_module is None:
        engine_module = importlib.import_module(_ENGINE_MODULE)
    base = engine_module.BaseTransferEngine

    class FerryDiffusionEngine(base):  # type: ignore[misc, valid-type]
        """sglang's engine interface over ``tensorferry.TransferEngine``."""

        def __init__(self, engine: TransferEngine) -> None:
            """Wraps ``engine``, which stays reachable as ``self.ferry``."""
            self.ferry = engine

        # Each member is tensorferry.TransferEngine's of the same name.
        @property
        def supports_gpu_direct(self) -> bool:
            """False: host memory."""
            return self.ferry.supports_gpu_direct

        @property
        def session_id(self) -> str:
            """What peers pass as ``dst_session_id``."""
            return self.ferry.session_id

        def register_buffer(self, ptr: int, length: int) -> None:
            """Registers ``length`` bytes at ``ptr``."""
            self.ferry.register_buffer(ptr, length)

        def deregister_buffer(self, ptr: int) -> None:
            """Ends the registration at ``ptr``."""
            self.ferry.deregister_buffer(ptr)

        def transfer_sync(self, dst_session_id: str, src_addr: int, dst_addr: int, length: int) -> int:
            """0 once every byte is at the peer, negative on failure."""
            return self.ferry.transfer_sync(dst_session_id, src_addr, dst_addr, length)

        def batch_transfer_sync(self, dst_session_id: str, src_addrs: list, dst_addrs: list, lengths: list) -> int:
            """``transfer_sync`` of the three lists at once."""
            return self.ferry.batch_transfer_sync(dst_session_id, src_addrs, dst_addrs, lengths)

    return FerryDiffusionEngine


def _opener(backend: str, options: Mapping[str, Any]) -> Callable[[Optional[str]], TransferEngine]:
    """What opens the engine for one factory call, given sglang's
    ``ib_device``: it becomes the verbs device unless ``options`` name one."""

    def open_engine(ib_device: Optional[str]) -> TransferEngine:
        """A ferry engine on ``backend`` with ``options``."""
        opts = dict(options)
        if backend == "verbs" and ib_device and "device" not in opts:
            opts["device"] = ib_device
        return TransferEngine(backend, **opts)

    return open_engine


def patch(engine_module: ModuleType, open_engine: Callable[[Optional[str]], TransferEngine], doc: str) -> Callable:
    """Points sglang's ``create_transfer_engine`` at a factory that answers
    with ``open_engine(ib_device)`` wrapped as sglang's engine type, in
    ``engine_module`` and in every already imported module that bound the
    name (a module imported later binds the patched one). Returns the
    factory. ``use()`` and ``use_environment()`` both come here."""
    cls = engine_class(engine_module)

    def create_transfer_engine(
        hostname: str = "127.0.0.1",
        gpu_id: int = 0,
        ib_device: Optional[str] = None,
    ) -> Any:
        """sglang's factory, answered with a ferry engine."""
        return cls(open_engine(ib_device))

    create_transfer_engine.__doc__ = doc
    create_transfer_engine.ferry = True  # type: ignore[attr-defined]
    engine_module.create_transfer_engine = create_transfer_engine
    for name in _USERS:
        # Only modules already (being) imported: importing one here would
        # load torch and sglang's scheduler from inside an import.
        user = sys.modules.get(name)
        if user is not None and hasattr(user, "create_transfer_engine"):
            user.create_transfer_engine = create_transfer_engine
    return create_transfer_engine


def use(backend: str = "auto", **options: Any) -> None:
    """Makes sglang's ``create_transfer_engine`` return a ferry engine on
    ``backend`` (with ``options``, as ``tensorferry.TransferEngine`` takes them),
    in this process.

    sglang's ``ib_device`` argument, when given, becomes the verbs device
    unless ``options`` name one. Modules that imported the factory by name
    before this call are patched too. For sglang's spawned workers, set
    ``FERRY_SGLANG`` instead (see ``use_environment``).
    """
    engine_module = importlib.import_module(_ENGINE_MODULE)
    patch(engine_module, _opener(backend, options), f"ferry's engine on {backend!r} (tensorferry.sglang.use)")


def settings(environ: Mapping[str, str] = os.environ) -> Tuple[str, dict]:
    """``(backend, options)`` as ``FERRY_SGLANG`` and
    ``FERRY_SGLANG_OPTIONS`` in ``environ`` say. Raises ``ValueError``
    naming the variable when one is wrong (an option the backend does not
    take shows only when the engine opens)."""
    backend = environ.get(BACKEND_VARIABLE, "")
    if backend not in BACKENDS:
        raise ValueError(
            f"{BACKEND_VARIABLE}={backend!r} is not one of ferry's backends "
            f"({', '.join(BACKENDS)}); set it to one, or unset it to keep sglang's own engine"
        )
    raw = environ.get(OPTIONS_VARIABLE, "").strip()
    if not raw:
        return backend, {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{OPTIONS_VARIABLE} is not JSON ({e}): {raw!r}") from None
    if not isinstance(options, dict):
        raise ValueError(
            f"{OPTIONS_VARIABLE} must be a JSON object of tensorferry.TransferEngine's options, "
            f'such as {{"timeout": 10}}; it is {raw!r}'
        )
    return backend, options


def _configured_opener(environ: Mapping[str, str]) -> Tuple[Callable[[Optional[str]], TransferEngine], str]:
    """The engine opener the environment's settings make, and one line
    saying what it does. Wrong settings make an opener that raises, so that
    importing sglang never fails on them: creating the engine does."""
    shown = f"{BACKEND_VARIABLE}={environ.get(BACKEND_VARIABLE, '')}"
    if environ.get(OPTIONS_VARIABLE, "").strip():
        shown += f" {OPTIONS_VARIABLE}={environ[OPTIONS_VARIABLE]}"
    try:
        backend, options = settings(environ)
    except ValueError as e:
        message = str(e)

        def refuse(ib_device: Optional[str]) -> TransferEngine:
            """Raises: the settings are wrong."""
            raise ValueError(f"ferry cannot open sglang's transfer engine: {message}")

        return refuse, f"ferry: sglang's create_transfer_engine will fail: {message}"

    open_engine = _opener(backend, options)

    def open_configured(ib_device: Optional[str]) -> TransferEngine:
        """``open_engine``, with errors that name the variables."""
        try:
            return open_engine(ib_device)
        except (TypeError, ValueError) as e:
            # The backend name is checked: these are about the options
            # (FERRY_SGLANG_OPTIONS, which `shown` names when it is set).
            kind = TypeError if isinstance(e, TypeError) else ValueError
            raise kind(f"{shown}: {e}") from e
        except Exception as e:
            e.add_note(f"ferry opened this engine for sglang because of {shown}")
            raise

    described = f"backend {backend!r}" + (f", options {json.dumps(options, sort_keys=True)}" if options else "")
    return open_configured, (
        f"ferry: sglang's create_transfer_engine answers with ferry's engine, {described} ({shown})"
    )


def use_environment(engine_module: Optional[ModuleType] = None, environ: Mapping[str, str] = os.environ) -> None:
    """What ``FERRY_SGLANG`` asks for: ``use(FERRY_SGLANG,
    **json.loads(FERRY_SGLANG_OPTIONS))`` on sglang's ``engine_module``
    (imported when not given). The import hook calls it once sglang has
    imported that module.

    Never raises on wrong settings: the factory raises them, naming the
    variable, when sglang first creates an engine. Logs one line per
    process, at WARNING on the ``tensorferry.sglang`` logger so that it shows
    before sglang configures logging (Python's last-resort handler prints
    WARNING and above to stderr) and after (sglang's handler on the root
    logger, at INFO by default): what sglang's factory will do.
    """
    global _announced
    if engine_module is None:
        engine_module = importlib.import_module(_ENGINE_MODULE)
    open_engine, line = _configured_opener(environ)
    patch(engine_module, open_engine, line)
    if not _announced:
        _announced = True
        _log.warning("%s", line)
