"""The body of a worker started the way sglang 0.5.23's launcher starts its
role workers (test_sglang_spawn.py): a fresh interpreter from
multiprocessing's spawn context, reporting over a one-way pipe.

It follows ``worker_bootstrap.bootstrap_scheduler_process``'s order
(platform, plugins, hooks, then the runtime modules), imports sglang's
``scheduler_mixin`` and calls the ``create_transfer_engine`` that module
bound, as sglang's scheduler does when a disaggregated role starts. It
imports nothing of ferry's itself before that call, so what it reports
about ferry is what the environment (``FERRY_SGLANG``) made of it.
"""

import sys
import traceback


def _failure(e: BaseException) -> dict:
    """An exception as data: its type, message and where it was raised."""
    frames = traceback.extract_tb(e.__traceback__)
    return {
        "type": type(e).__name__,
        "message": str(e),
        "raised_in": frames[-1].filename if frames else None,
    }


def _transfer(factory) -> dict:
    """Two engines from sglang's factory move 1 MiB from one to the other."""
    import numpy as np

    a = factory(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    b = factory(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    src = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros(1 << 20, dtype=np.uint8)
    a.register_buffer(src.ctypes.data, src.nbytes)
    b.register_buffer(dst.ctypes.data, dst.nbytes)
    rc = a.transfer_sync(b.session_id, src.ctypes.data, dst.ctypes.data, src.nbytes)
    same = bool((src == dst).all())
    a.deregister_buffer(src.ctypes.data)
    b.deregister_buffer(dst.ctypes.data)
    a.ferry.close()
    b.ferry.close()
    return {"rc": rc, "same": same}


def probe() -> dict:
    """What sglang's scheduler gets from ``create_transfer_engine`` here."""
    report = {
        "hook_at_start": "_tensorferry_sglang" in sys.modules,
        "ferry_at_start": "tensorferry" in sys.modules,
        "sglang_at_start": "sglang" in sys.modules,
    }
    from sglang.multimodal_gen.runtime.platforms import initialize_current_platform

    initialize_current_platform()
    from sglang.multimodal_gen.runtime.platforms.plugins import apply_plugin_hooks, load_plugins

    load_plugins()
    apply_plugin_hooks()
    try:
        from sglang.multimodal_gen.runtime.disaggregation import scheduler_mixin
    except ModuleNotFoundError as e:
        report["import_error"] = {"missing": e.name, **_failure(e)}
        return report
    from sglang.multimodal_gen.runtime.disaggregation.transport import engine as engine_module

    factory = scheduler_mixin.create_transfer_engine
    report["factory_module"] = factory.__module__
    report["same_factory_as_engine_module"] = factory is engine_module.create_transfer_engine
    report["ferry_native_before_engine"] = "tensorferry._native" in sys.modules
    try:
        engine = factory(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    except Exception as e:  # noqa: BLE001 - reported to the test
        report["create_error"] = _failure(e)
        return report
    import tensorferry

    report["class"] = f"{type(engine).__module__}.{type(engine).__name__}"
    report["is_sglang_engine"] = isinstance(engine, engine_module.BaseTransferEngine)
    report["is_ferry_engine"] = isinstance(getattr(engine, "ferry", None), tensorferry.TransferEngine)
    report["backend"] = engine.ferry.backend
    report["session_id"] = engine.session_id
    report["supports_gpu_direct"] = engine.supports_gpu_direct
    engine.ferry.close()
    report["transfer"] = _transfer(factory)
    return report


def main(writer) -> None:
    """The spawned process's target: sends ``probe()``'s report (or how it
    failed) through ``writer``, sglang's startup pipe end."""
    try:
        report = probe()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        report = {"crashed": _failure(e), "traceback": traceback.format_exc()}
    writer.send(report)
    writer.close()
