"""The `sage` CLI as a user runs it, in a real process: one helper for the tests that start it.

`sage(*args, home=...)` runs ``python -m sage_cli ARGS`` on this checkout's code (PYTHONPATH), with
its own SAGE_HOME, a wide terminal (tables are not wrapped) and SAGE_DEBUG off (a bad input is the
one-line error users see, not a traceback), and returns the finished process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sage(
    *args: str, home: Path, cwd: Path | None = None, timeout: float = 120, columns: int = 250
) -> subprocess.CompletedProcess[str]:
    """``sage ARGS`` in a child process (module docstring); `cwd` defaults to `home`."""
    env = {**os.environ, "COLUMNS": str(columns), "SAGE_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("SAGE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sage_cli", *args],
        cwd=cwd if cwd is not None else home,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def benchmark(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``sage llm benchmark ARGS`` (`sage`), run in `home`."""
    return sage("llm", "benchmark", *args, home=home, timeout=timeout)
