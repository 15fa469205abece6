"""ferry's import hook for sglang, switched on by ``FERRY_SGLANG``.

Why: sglang 0.5.23 starts its role workers with multiprocessing's *spawn*
context, so each worker imports sglang afresh and a ``tensorferry.sglang.use()``
made in the launcher never reaches them. The environment does. The wheel
ships ``tensorferry_sglang.pth`` in site-packages, whose one line imports this
module and calls ``install()`` only when ``FERRY_SGLANG`` is set (so with
it unset, no process imports anything of ferry's or sglang's).

``install()`` puts a finder first on ``sys.meta_path`` that answers only
for sglang's engine module
(``sglang.multimodal_gen.runtime.disaggregation.transport.engine``): it
takes the spec the other finders make and wraps its loader, whose
``exec_module`` runs sglang's module and then has ``tensorferry.sglang`` point
its ``create_transfer_engine`` at ferry's engine. So sglang's
``scheduler_mixin``, which imports that name from the module, binds
ferry's factory. Nothing of ferry (``tensorferry._native`` included) or of
sglang is imported before sglang imports its engine module.

This is a top-level module, not part of the ``ferry`` package, because
importing ``tensorferry.anything`` runs ``tensorferry/__init__.py``, which loads the
extension module.

Nothing here raises into the importing process: a ferry that cannot be
loaded leaves a factory that raises, naming ``FERRY_SGLANG``, when sglang
creates its engine. The one log line per process (``tensorferry.sglang``'s
logger, WARNING) is written by ``tensorferry.sglang.use_environment``.
"""

import sys

#: The module whose ``create_transfer_engine`` is patched.
ENGINE_MODULE = "sglang.multimodal_gen.runtime.disaggregation.transport.engine"
#: The variable that switches this on (tensorferry.sglang.BACKEND_VARIABLE).
VARIABLE = "FERRY_SGLANG"


def _patch(module) -> None:
    """Patches sglang's engine ``module`` as ``FERRY_SGLANG`` says. If
    ferry cannot be loaded, leaves a factory that raises saying so."""
    try:
        from tensorferry.sglang import use_environment

        use_environment(module)
    except Exception as e:  # noqa: BLE001 - importing sglang must not fail
        _refuse(module, e)


def _refuse(module, error: BaseException) -> None:
    """Points ``module.create_transfer_engine`` at a factory that raises:
    ferry was asked for and cannot be loaded (``error``)."""
    import os

    setting = f"{VARIABLE}={os.environ.get(VARIABLE, '')}"
    message = f"{setting} is set, but ferry's sglang engine cannot be loaded: {error!r}"
    sys.stderr.write(f"ferry: {message}\n")

    def create_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None):
        """Raises: ferry was asked for and cannot be loaded."""
        raise RuntimeError(message) from error

    module.create_transfer_engine = create_transfer_engine


class _PatchingLoader:
    """sglang's loader for the engine module, patching once it has run.

    It has ``importlib.abc.Loader``'s protocol (``create_module``,
    ``exec_module``) without deriving from it: importing ``importlib.abc``
    costs about 27 ms at start-up (it brings ``typing``, ``pathlib`` and
    ``importlib.resources``), which every process of the environment would
    pay while ``FERRY_SGLANG`` is set."""

    def __init__(self, real) -> None:
        """Wraps ``real``, the loader the import system found."""
        self._real = real

    def create_module(self, spec):
        """The real loader's module (``None``: the default one)."""
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        """Runs sglang's module, then patches its factory."""
        self._real.exec_module(module)
        _patch(module)

    def __getattr__(self, name):
        """Everything else (``get_source``, ``get_code``, ...) is the real
        loader's."""
        if name == "_real":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self._real, name)


class _Finder:
    """Finds sglang's engine module as the rest of ``sys.meta_path`` does,
    with its loader wrapped; answers ``None`` for every other module.

    ``importlib.abc.MetaPathFinder``'s protocol (``find_spec``), without
    the import (see ``_PatchingLoader``)."""

    def find_spec(self, fullname, path, target=None):
        """The engine module's spec with a patching loader, else ``None``."""
        if fullname != ENGINE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once per process) and, if
    sglang's engine module is already imported, patches it now. Called by
    ``tensorferry_sglang.pth`` when ``FERRY_SGLANG`` is set; never raises."""
    try:
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        module = sys.modules.get(ENGINE_MODULE)
        if module is not None and hasattr(module, "create_transfer_engine"):
            _patch(module)
    except Exception as e:  # noqa: BLE001 - start-up must not fail
        sys.stderr.write(f"ferry: the sglang import hook ({VARIABLE}) is not installed: {e!r}\n")
