"""A fresh copy of this checkout, as a clone has it: for the tests that run what a new user runs
(tests/test_readme_commands.py, tests/test_shipped_traces.py).

The files git tracks, and the new ones it does not ignore (so that a change not yet committed is
tested as it will be cloned), without build outputs, virtual environments or caches; with
`compiled=True` also the compiled core built in this checkout (ignored by git, built by `pip
install -e .` in a clone, as the README's install does).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["ROOT", "fresh_copy"]

ROOT = Path(__file__).resolve().parent.parent
_COMPILED = ("sage_eviction/*.so", "engine_adapter/cache/*.so")


def fresh_copy(dest: Path, *, compiled: bool = False) -> Path:
    """Copy the checkout's files into `dest` (see the module docstring); returns `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = list(filter(None, listed.split("\0")))
    if compiled:
        names += [str(p.relative_to(ROOT)) for pattern in _COMPILED for p in ROOT.glob(pattern)]
    for name in names:
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest
