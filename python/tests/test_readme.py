"""The README's Python example runs as written (the Rust one is a doc test)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_python_example_runs(tmp_path):
    blocks = python_blocks(README.read_text())
    assert blocks, "README.md has no ```python block"
    for i, code in enumerate(blocks):
        script = tmp_path / f"readme_{i}.py"
        script.write_text(code)
        # Its own process and working directory: the example needs nothing
        # but the installed package.
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"README block {i} failed:\n{done.stdout}\n{done.stderr}"
