"""Builds sage's optional compiled core; everything else is in pyproject.toml.

Each extension below is a Cython source that mirrors a pure-Python module (the reference and the
fallback, see sage_eviction/native.py). Building them is best effort: where Cython or a C compiler
is missing (`CC=false pip install -e .`), the install still succeeds, says why in one line, and
sage runs the pure-Python code.
"""

from __future__ import annotations

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# module name -> Cython source (relative to the repository root)
NATIVE_MODULES: dict[str, str] = {
    "sage_eviction._core": "sage_eviction/_core.pyx",  # the score heap and select_victims
    # the radix cache's hot paths (mirrors engine_adapter/cache/radix_cache.py)
    "engine_adapter.cache._core": "engine_adapter/cache/_core.pyx",
    # the simulator's flat row in one call (mirrors Simulator.run's event loop for the flat model)
    "engine_adapter.sim._flat_run": "engine_adapter/sim/_flat_run.pyx",
    # the regret ghost set for int64 keys (mirrors engine_adapter/cache/ghosts.py's GhostSet)
    "engine_adapter.cache._ghosts": "engine_adapter/cache/_ghosts.pyx",
    # the simulator's radix row in one call (mirrors Simulator.run over the CacheManager)
    "engine_adapter.sim._radix_run": "engine_adapter/sim/_radix_run.pyx",
    # batch-invariant paged attention (mirrors invariant_attention.py's rowwise_attention)
    "engine_adapter.model._attention": "engine_adapter/model/_attention.pyx",
}

INCLUDE_PATH = ["sage_eviction"]
"""Where a source's `include` looks after its own folder: the policies' core's int64 table and
lists (sage_eviction/_core_i64map.pxi, _core_flat_lists.pxi) serve the ghost set too, one source."""


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on when an extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (distutils raises several kinds)
            _skip("the compiled core", exc)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            _skip(ext.name, exc)


def _skip(what: str, exc: BaseException) -> None:
    print(f"sage: {what} not built ({type(exc).__name__}: {exc}); the pure-Python code runs", file=sys.stderr)


def _extensions() -> list[object]:
    if not NATIVE_MODULES:
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError as exc:
        _skip("the compiled core", exc)
        return []
    modules = [
        Extension(name, [source], extra_compile_args=["-O3"]) for name, source in NATIVE_MODULES.items()
    ]
    directives = {"boundscheck": False, "wraparound": False}
    built = cythonize(modules, language_level=3, compiler_directives=directives, include_path=INCLUDE_PATH)
    return list(built)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
