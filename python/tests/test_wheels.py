"""The built wheels as a user installs them: a fresh venv gets only
tensorferry and tensorferry-fabric (pip, no index: the wheels must need
nothing else), and two processes of its interpreter, run from a directory
outside the tree, move bytes with tensorferry.TransferEngine on the local
backend and on the fabric backend over libfabric's tcp;ofi_rxm and shm
providers. Each process reports what it loaded: ferry's modules from the
venv only, and on fabric the libfabric bundled in the plugin's wheel
(tensorferry_fabric.libs), never the host's; on local, no libfabric.

Needs ``FERRY_WHEELS_DIR`` (a directory holding exactly the two wheels:
``scripts/wheels build DIR``); skipped without it, unless
``FERRY_REQUIRE_WHEELS=1``, which makes its absence a failure. Everything it
makes is in a temporary directory (under TMPDIR) it removes."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from procs import required_setting

WHEELS = required_setting("FERRY_WHEELS_DIR", "FERRY_REQUIRE_WHEELS", "scripts/wheels build DIR")

# One xdist worker takes every test here (`--dist loadgroup`), so that the
# module's venv is made once.
pytestmark = pytest.mark.xdist_group("wheels")

HERE = Path(__file__).resolve().parent
TREE = HERE.parent.parent
MiB = 1 << 20

BACKENDS = [
    ("local", "local", {}),
    ("fabric-tcp", "fabric", {"provider": "tcp;ofi_rxm", "write_timeout": 10.0}),
]


def clean_env() -> dict:
    """This environment without what would let the venv's interpreter find
    anything but the venv (or libraries but the wheels' own)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PIP_", "FI_", "LD_"))
        and k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "FERRY_SGLANG")
    }
    # tcp;ofi_rxm on loopback needs its interface named.
    env["FI_TCP_IFACE"] = "lo"
    # No pip configuration (an index or find-links of this machine's).
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.fixture(scope="module")
def venv():
    """(the fresh venv's directory, its python, a directory outside the
    tree holding wheel_peer.py)."""
    wheels = sorted(Path(WHEELS).glob("*.whl"))
    names = sorted(w.name.split("-")[0] for w in wheels)
    assert names == ["tensorferry", "tensorferry_fabric"], f"{WHEELS} must hold exactly the two wheels: {wheels}"
    for w in wheels:
        tags = w.name[: -len(".whl")].split("-")[-3:]
        assert tags[0] == "cp311" and tags[1] == "abi3", w.name
        assert all(p.startswith("manylinux") for p in tags[2].split(".")), w.name
    scratch = Path(tempfile.mkdtemp(prefix="ferry-wheels-"))
    try:
        env = clean_env()
        root = scratch / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, env=env, cwd=scratch, timeout=300)
        python = root / "bin" / "python"
        # No index: a dependency the wheels declared would fail the install.
        subprocess.run(
            [str(python), "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
             "--no-cache-dir", *map(str, wheels)],
            check=True, env=env, cwd=scratch, timeout=300,
        )
        run = scratch / "run"
        run.mkdir()
        shutil.copy(HERE / "wheel_peer.py", run / "wheel_peer.py")
        yield root, python, run
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_line(proc: subprocess.Popen, within: float) -> dict:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(within):
            raise AssertionError(f"no answer within {within} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the receiver ended (exit status {proc.wait()})")
    return json.loads(line)


def check_loaded(loaded: dict, root: Path, backend: str) -> None:
    """Ferry's modules came from the venv, and libfabric (on fabric) from
    the plugin's wheel."""
    root = root.resolve()
    site = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert Path(loaded["prefix"]).resolve() == root, loaded["prefix"]
    assert not any(p and Path(p).resolve().is_relative_to(TREE) for p in loaded["path"]), loaded["path"]
    modules = loaded["modules"]
    assert "tensorferry._native" in modules, modules
    for name, file in modules.items():
        if file is not None:
            assert Path(file).resolve().is_relative_to(site), (name, file)
    libs = loaded["libfabric"]
    if backend == "fabric":
        assert "tensorferry_fabric._native" in modules, modules
        bundled = site / "tensorferry_fabric.libs"
        assert libs, "no libfabric mapped in a process on the fabric backend"
        for lib in libs:
            path = Path(lib).resolve()
            assert path.parent == bundled and path.name.startswith("libfabric-"), f"{lib} is not the bundled libfabric"
    else:
        assert libs == [], f"the local backend loaded libfabric: {libs}"


@pytest.mark.parametrize("name,backend,options", BACKENDS, ids=[b[0] for b in BACKENDS])
def test_installed_wheels_transfer_between_two_processes(venv, name, backend, options):
    root, python, run = venv
    env = clean_env()
    spec = {
        "backend": backend,
        "options": options,
        "size": 8 * MiB + 8192,
        "offset": 4093,
        "length": 8 * MiB + 5,
        "split": 3 * MiB + 1,
        "seed": 11,
    }
    receiver = subprocess.Popen(
        [str(python), "-I", "wheel_peer.py", json.dumps({**spec, "role": "receiver"})],
        cwd=run, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    sender = None
    try:
        hello = read_line(receiver, 60)
        assert hello.get("backend") == backend, hello
        check_loaded(hello["loaded"], root, backend)
        sender = subprocess.Popen(
            [str(python), "-I", "wheel_peer.py",
             json.dumps({**spec, "role": "sender", "to": hello["session"], "addr": hello["addr"]})],
            cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        out, err = sender.communicate(timeout=120)
        assert sender.returncode == 0, err
        sent = json.loads(out.strip().splitlines()[-1])
        assert sent["rc"] == 0 and sent["done"] is True, sent
        check_loaded(sent["loaded"], root, backend)
        receiver.stdin.write("check\n")
        receiver.stdin.flush()
        got = read_line(receiver, 60)
        assert got["equal"], got
        assert got["notifications"] == [[sent["session"], b"written".hex()]], got
        receiver.stdin.close()
        assert receiver.wait(30) == 0
    finally:
        for proc in (receiver, sender):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    if f is not None:
                        f.close()
                except (BrokenPipeError, OSError):
                    pass
            # libfabric's shm provider names its objects <pid>:...; a killed
            # process cannot remove its own.
            for leftover in Path("/dev/shm").glob(f"{proc.pid}:*"):
                leftover.unlink(missing_ok=True)


def test_the_installed_engine_opens_libfabric_shm_and_refuses_it_naming_the_local_backend(venv):
    """The plugin's bundled libfabric opens its shm provider, and the engine
    refuses it (shm cannot end an operation a peer has taken), naming what
    serves instead."""
    root, python, run = venv
    script = (
        "import tensorferry\n"
        "try:\n"
        "    tensorferry.TransferEngine('fabric', provider='shm')\n"
        "except tensorferry.FerryError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('opened')\n"
    )
    out = subprocess.run([str(python), "-I", "-c", script], cwd=run, env=clean_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out
    assert "libfabric shm" in out.stdout and "local data plane" in out.stdout, out.stdout
