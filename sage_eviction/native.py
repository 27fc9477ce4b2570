"""Which implementation of the hot paths runs: the compiled core or the pure-Python reference.

The compiled core is a set of optional C extensions built from Cython sources at install time.
`CORE_SOURCES` and `MODEL_SOURCES` below are the one list of them: setup.py builds what they
name (it loads this file by path, in pip's isolated build environment, so this module imports
nothing but the standard library and nothing of its package). Each mirrors a pure-Python
module that stays the reference and the fallback: same public API, same results (tests/ runs
both side by side). A machine without a C compiler installs without the extensions and runs the
pure-Python code; `SAGE_PURE_PYTHON=1` forces the pure-Python code where the extensions are built.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import ModuleType

__all__ = [
    "CORE",
    "CORE_SOURCES",
    "MODEL_MODULES",
    "MODEL_SOURCES",
    "NATIVE_MODULES",
    "PURE_ENV",
    "core",
    "core_implementation",
    "implementation",
    "load",
    "pure_forced",
    "pure_python",
    "unavailable",
]

PURE_ENV = "SAGE_PURE_PYTHON"
CORE = "sage_eviction._core"
"""The policies' compiled core (sage_eviction/_core.pyx): the score heap and `select_victims`."""

CORE_SOURCES: dict[str, str] = {
    CORE: "sage_eviction/_core.pyx",  # the score heap and select_victims
    # the radix cache's hot paths (mirrors engine_adapter/cache/radix_cache.py)
    "engine_adapter.cache._core": "engine_adapter/cache/_core.pyx",
    # the regret ghost set for int64 keys (mirrors engine_adapter/cache/ghosts.py's GhostSet)
    "engine_adapter.cache._ghosts": "engine_adapter/cache/_ghosts.pyx",
    # the simulator's flat row in one call (mirrors Simulator.run's event loop for the flat model)
    "engine_adapter.sim._flat_run": "engine_adapter/sim/_flat_run.pyx",
    # the simulator's radix row in one call (mirrors Simulator.run over the CacheManager)
    "engine_adapter.sim._radix_run": "engine_adapter/sim/_radix_run.pyx",
}
"""Every compiled module of the core -> its Cython source (relative to the repository root): the
policies', the radix cache's, its ghost set's for int64 keys and the simulator's row loops."""

MODEL_SOURCES: dict[str, str] = {
    # batch-invariant paged attention (mirrors invariant_attention.py's rowwise_attention)
    "engine_adapter.model._attention": "engine_adapter/model/_attention.pyx",
}
"""The model's compiled modules -> their sources: apart from the core's because loading one
imports ``engine_adapter.model`` and so torch, which the simulator and the light commands that
report `core_implementation` never load."""

NATIVE_MODULES: tuple[str, ...] = tuple(CORE_SOURCES)
"""The core's module names. Names only: this package imports nothing from engine_adapter;
`load` imports a module by name when asked."""

MODEL_MODULES: tuple[str, ...] = tuple(MODEL_SOURCES)
"""The model's module names (`MODEL_SOURCES`)."""

_loaded: dict[str, ModuleType | None] = {}
_pure_here: ContextVar[bool] = ContextVar("sage_pure_python", default=False)


@contextmanager
def pure_python() -> Iterator[None]:
    """Objects built inside use the pure-Python code even where the compiled core is built.

    Each object chooses once, when it is built, and keeps its choice: the differential tests
    build one policy in here and its twin outside, and drive both side by side."""
    token = _pure_here.set(True)
    try:
        yield
    finally:
        _pure_here.reset(token)


def core() -> ModuleType | None:
    """`load(CORE)`: what a policy being built now uses, None for the pure-Python code."""
    return None if _pure_here.get() else load(CORE)


def pure_forced() -> bool:
    """`SAGE_PURE_PYTHON` is set to anything but empty or 0."""
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module `name` (e.g. "sage_eviction._core"), or None when it is not built or
    `SAGE_PURE_PYTHON` forces the pure-Python code. Read once per process."""
    if name not in _loaded:
        module: ModuleType | None = None
        if not pure_forced():
            try:
                module = importlib.import_module(name)
            except ImportError:
                module = None
        _loaded[name] = module
    return _loaded[name]


def implementation(*names: str) -> str:
    """ "compiled" when every module in `names` loads, else "pure-python" (with the reason)."""
    if pure_forced():
        return f"pure-python ({PURE_ENV}=1)"
    if _pure_here.get():
        return "pure-python (inside native.pure_python())"
    missing = [name for name in names if load(name) is None]
    if missing:
        return f"pure-python ({', '.join(missing)} not built)"
    return "compiled"


def unavailable(*names: str) -> str:
    """Why compiled `names` do not run, for a row that says so: `implementation`'s reason, or
    that a caller switched them off (a test's stand-in loader)."""
    found = implementation(*names)
    return found if found != "compiled" else "pure-python (switched off)"


def core_implementation() -> str:
    """Which implementation of the whole core runs (`implementation` over `NATIVE_MODULES`): what
    `sage llm benchmark` and `sage llm engine status` report."""
    return implementation(*NATIVE_MODULES)
