"""A fresh copy of this checkout, as a clone has it: for the tests that run what a new user runs
(tests/test_readme_commands.py, tests/test_shipped_traces.py).

The files git tracks, and the new ones it does not ignore (so that a change not yet committed is
tested as it will be cloned), without build outputs, virtual environments or caches; with
`compiled=True` also the compiled modules built in this checkout (ignored by git, built by `pip
install -e .` in a clone, as the README's install does): every module of `sage_eviction.native`'s
`NATIVE_MODULES` and `MODEL_MODULES`, the lists setup.py's build is held to
(tests/test_build_cache.py). A hand-written list here once copied only the modules in
sage_eviction/ and engine_adapter/cache/, so the clone's simulator rows silently ran their
pure-Python loops instead of the compiled ones a real install runs (issue 48).
"""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
from pathlib import Path

from sage_eviction.native import MODEL_MODULES, NATIVE_MODULES

__all__ = ["ROOT", "compiled_files", "fresh_copy"]

ROOT = Path(__file__).resolve().parent.parent


def compiled_files() -> list[str]:
    """The built files of every compiled module in this checkout (relative paths), those of
    modules not built here left out."""
    return [
        path
        for module in (*NATIVE_MODULES, *MODEL_MODULES)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (ROOT / (path := module.replace(".", "/") + suffix)).is_file()
    ]


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
        names += compiled_files()
    for name in names:
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest
