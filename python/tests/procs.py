"""The tests' helper processes: Python scripts that take commands as JSON
lines on stdin and answer each with one JSON line on stdout."""

import importlib
import json
import os
import selectors
import subprocess
import sys
import types
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent


def required_setting(name: str, require: str, how: str) -> str:
    """The environment's ``name``, which a test module needs (``how``: how
    to make it). Without it the module is skipped, unless the
    environment's ``require`` is ``1``: then its absence is a failure."""
    value = os.environ.get(name)
    if not value:
        if os.environ.get(require) == "1":
            raise RuntimeError(f"{require}=1 but {name} is not set ({how})")
        import pytest

        pytest.skip(f"{name} is not set ({how})", allow_module_level=True)
    return value


def required_module(name: str, require: str = "FERRY_REQUIRE_SGLANG") -> types.ModuleType:
    """The module ``name``, which a test needs (torch and pyzmq come with
    sglang's environment, ``scripts/sglang-env``). Without it the test (or,
    called at module level, the module) is skipped, unless the
    environment's ``require`` is ``1``: then its absence is a failure."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if os.environ.get(require) == "1":
            raise RuntimeError(f"{require}=1 but {name} cannot be imported: {e}") from e
        import pytest

        pytest.skip(
            f"{name} cannot be imported ({e}); run in sglang's environment (scripts/sglang-env)",
            allow_module_level=True,
        )


def reply(**fields) -> None:
    """Answers one command (in the helper process)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class LineProcess:
    """A helper script started with a JSON spec, spoken to by JSON lines.

    ``python``: the interpreter (this one by default); ``env``: its
    environment (this one's by default); ``within``: seconds an answer may
    take before ``read`` raises (unbounded by default); ``greet``: read its
    first line (``hello``) now, else leave it to the caller's first
    ``read`` (so that slow starters start side by side)."""

    def __init__(
        self,
        script: str,
        spec: dict,
        *,
        python: str = sys.executable,
        env: Optional[dict] = None,
        within: Optional[float] = None,
        greet: bool = True,
    ) -> None:
        self.proc = subprocess.Popen(
            [python, str(HERE / script), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._within = within
        self.hello = self.read() if greet else None

    def read(self) -> dict:
        if self._within is not None:
            with selectors.DefaultSelector() as sel:
                sel.register(self.proc.stdout, selectors.EVENT_READ)
                if not sel.select(self._within):
                    raise RuntimeError(f"the helper process did not answer within {self._within} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the helper process ended (exit status {self.proc.wait()})")
        return json.loads(line)

    def tell(self, **cmd) -> None:
        """Sends a command without waiting for its answer (`read` it later)."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, **cmd) -> dict:
        self.tell(**cmd)
        return self.read()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Asks it to exit, and waits (killing it if it does not)."""
        if self.proc.poll() is None:
            try:
                self.ask(op="exit")
            except (RuntimeError, BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except BrokenPipeError:
                pass
