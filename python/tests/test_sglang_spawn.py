"""``FERRY_SGLANG`` switches sglang 0.5.23 onto ferry in the processes
sglang's launcher spawns, where ``tensorferry.sglang.use()`` in the launcher
cannot reach (issue 29, item 4).

A worker is started as ``launch_server._start_scheduler_processes`` starts
one (multiprocessing's spawn context, a one-way pipe, a daemon process),
runs sglang's own bootstrap steps and calls the ``create_transfer_engine``
that sglang's ``scheduler_mixin`` bound (sglang_spawn_worker.py). With the
variable it gets ferry's engine, and moves bytes with it; without it,
sglang's own factory (Mooncake's engine, which is not installed here); with
a wrong value, an error naming the variable, raised by the factory and not
by the import. A fresh interpreter with the variable unset imports neither
ferry nor sglang.

These run against the installed wheel: its ``tensorferry_sglang.pth`` is what
reads the variable.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

if os.environ.get("FERRY_REQUIRE_SGLANG") != "1":
    pytest.importorskip("sglang.multimodal_gen.runtime.disaggregation.transport.engine")

import tensorferry  # noqa: E402
import tensorferry.sglang  # noqa: E402
import sglang_spawn_worker  # noqa: E402
from sglang.multimodal_gen.runtime.disaggregation.transport import engine as engine_module  # noqa: E402

VARIABLES = ("FERRY_SGLANG", "FERRY_SGLANG_OPTIONS")
#: How long a spawned worker may take to import sglang and report.
WORKER_TIMEOUT = 300
ANNOUNCEMENT = "ferry: sglang's create_transfer_engine answers with ferry's engine"


def spawn_worker(monkeypatch, **env) -> dict:
    """Runs sglang_spawn_worker.main in a process started as sglang 0.5.23's
    launcher starts a role worker, with ``env`` (and neither variable
    otherwise) in its environment; returns its report."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(
        target=sglang_spawn_worker.main,
        args=(writer,),
        name="sglang-diffusionWorker-0",
        daemon=True,
    )
    try:
        process.start()
        writer.close()
        assert reader.poll(WORKER_TIMEOUT), "the spawned worker did not report"
        report = reader.recv()
    finally:
        reader.close()
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    assert "crashed" not in report, report.get("traceback")
    if "import_error" in report:
        missing = report["import_error"]
        why = (
            f"sglang's scheduler_mixin cannot be imported here: {missing['message']} "
            "(sglang 0.5.23's [diffusion] extra has it; the sglang environment's pins lack it)"
        )
        if os.environ.get("FERRY_REQUIRE_SGLANG") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return report


def test_a_spawned_worker_gets_ferrys_engine_from_the_environment(monkeypatch, capfd):
    report = spawn_worker(monkeypatch, FERRY_SGLANG="local", FERRY_SGLANG_OPTIONS='{"timeout": 10}')
    # The .pth installed the hook and nothing else: ferry loaded only when
    # sglang imported its engine module.
    assert report["hook_at_start"] and not report["ferry_at_start"] and not report["sglang_at_start"]
    # scheduler_mixin bound ferry's factory: the engine module was patched
    # before scheduler_mixin's `from ... import create_transfer_engine` ran.
    assert report["factory_module"] == "tensorferry.sglang"
    assert report["same_factory_as_engine_module"]
    assert report.get("create_error") is None, report
    assert report["class"] == "tensorferry.sglang.FerryDiffusionEngine"
    assert report["is_sglang_engine"] and report["is_ferry_engine"]
    assert report["backend"] == "local"
    assert report["session_id"]
    assert report["supports_gpu_direct"] is False
    assert report["transfer"] == {"rc": 0, "same": True}
    # One line in the worker's log, naming the backend.
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if ANNOUNCEMENT in line]
    assert len(lines) == 1, err
    assert "backend 'local'" in lines[0] and "FERRY_SGLANG=local" in lines[0]


def test_without_the_variable_a_spawned_worker_gets_sglangs_own_factory(monkeypatch, capfd):
    report = spawn_worker(monkeypatch)
    assert not report["hook_at_start"] and not report["ferry_at_start"]
    assert report["factory_module"] == "sglang.multimodal_gen.runtime.disaggregation.transport.engine"
    assert report["same_factory_as_engine_module"]
    assert not report["ferry_native_before_engine"]
    # sglang's factory goes for Mooncake, which this environment lacks.
    error = report["create_error"]
    assert error["type"] == "ImportError", error
    assert "Please install mooncake" in error["message"]
    assert Path(error["raised_in"]).name == "mooncake_transfer_engine.py"
    assert ANNOUNCEMENT not in capfd.readouterr().err


def test_a_wrong_backend_fails_at_engine_creation_naming_the_variable(monkeypatch):
    report = spawn_worker(monkeypatch, FERRY_SGLANG="nonsense")
    # Importing sglang went through; creating the engine did not.
    assert report["factory_module"] == "tensorferry.sglang"
    error = report["create_error"]
    assert error["type"] == "ValueError", error
    assert "FERRY_SGLANG='nonsense'" in error["message"]


def fresh_interpreter(code: str, **env) -> str:
    """``code``'s output in a new interpreter of this environment, started
    with ``env`` and neither variable otherwise, in an empty directory (away
    from the sources)."""
    environ = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    environ.update(env)
    with tempfile.TemporaryDirectory(prefix="sglang-spawn-") as empty:
        done = subprocess.run(
            [sys.executable, "-c", code], env=environ, cwd=empty, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_pth_is_installed_and_imports_nothing_unless_the_variable_is_set():
    pth = Path(tensorferry.__file__).resolve().parent.parent / "tensorferry_sglang.pth"
    assert pth.is_file(), f"{pth} is missing: build the wheel and pip install it"
    modules = "import sys; import site; print('sglang' in sys.modules, 'tensorferry' in sys.modules"
    assert fresh_interpreter(modules + ")") == "False False"
    hooked = modules + ", '_tensorferry_sglang' in sys.modules, type(sys.meta_path[0]).__name__)"
    assert fresh_interpreter(hooked, FERRY_SGLANG="local") == "False False True _Finder"
    # An empty value is unset.
    assert fresh_interpreter(hooked, FERRY_SGLANG="").startswith("False False False ")


@pytest.fixture
def restored_factory(monkeypatch):
    """sglang's engine module (in this process), its factory put back after
    the test."""
    monkeypatch.setattr(engine_module, "create_transfer_engine", engine_module.create_transfer_engine)
    users = [sys.modules[name] for name in tensorferry.sglang._USERS if name in sys.modules]
    for user in users:
        monkeypatch.setattr(user, "create_transfer_engine", user.create_transfer_engine)
    return engine_module


@pytest.mark.parametrize(
    "options, kind, mentions",
    [
        ("{timeout: 3", ValueError, "is not JSON"),
        ("[1, 2]", ValueError, "must be a JSON object"),
        ('{"bogus": 1}', TypeError, "bogus"),
        ('{"timeout": "soon"}', TypeError, "timeout"),
    ],
    ids=["bad-json", "not-an-object", "unknown-option", "wrong-type"],
)
def test_wrong_options_fail_at_engine_creation_naming_the_variable(restored_factory, options, kind, mentions):
    environ = {"FERRY_SGLANG": "local", "FERRY_SGLANG_OPTIONS": options}
    tensorferry.sglang.use_environment(restored_factory, environ)  # does not raise
    with pytest.raises(kind) as raised:
        restored_factory.create_transfer_engine(hostname="127.0.0.1", gpu_id=0)
    assert "FERRY_SGLANG_OPTIONS" in str(raised.value)
    assert mentions in str(raised.value)


def test_options_from_the_environment_reach_the_engine(restored_factory):
    environ = {"FERRY_SGLANG": "local", "FERRY_SGLANG_OPTIONS": json.dumps({"timeout": 5, "threads": 2})}
    tensorferry.sglang.use_environment(restored_factory, environ)
    engine = restored_factory.create_transfer_engine(hostname="127.0.0.1", gpu_id=0)
    assert isinstance(engine, restored_factory.BaseTransferEngine)
    assert engine.ferry.backend == "local" and engine.session_id
    engine.ferry.close()


def test_the_hook_patches_an_engine_module_already_imported(restored_factory, monkeypatch):
    import _tensorferry_sglang

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("FERRY_SGLANG", "local")
    monkeypatch.delenv("FERRY_SGLANG_OPTIONS", raising=False)
    _tensorferry_sglang.install()
    _tensorferry_sglang.install()  # once is enough; twice changes nothing
    assert sum(isinstance(f, _tensorferry_sglang._Finder) for f in sys.meta_path) == 1
    assert restored_factory.create_transfer_engine.__module__ == "tensorferry.sglang"
    engine = restored_factory.create_transfer_engine()
    assert engine.ferry.backend == "local"
    engine.ferry.close()


def test_a_ferry_that_cannot_load_leaves_a_factory_naming_the_variable(monkeypatch, capfd):
    import types

    import _tensorferry_sglang

    monkeypatch.setenv("FERRY_SGLANG", "local")
    monkeypatch.setitem(sys.modules, "tensorferry.sglang", None)  # importing it raises ImportError
    module = types.ModuleType("stand_in_for_sglangs_engine_module")
    _tensorferry_sglang._patch(module)  # does not raise
    with pytest.raises(RuntimeError, match="FERRY_SGLANG=local is set, but ferry's sglang engine cannot be loaded"):
        module.create_transfer_engine()
    assert "FERRY_SGLANG=local is set" in capfd.readouterr().err
