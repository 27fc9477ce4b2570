"""Builds sage's optional compiled core; everything else is in pyproject.toml.

Each extension is a Cython source that mirrors a pure-Python module (the reference and the
fallback); sage_eviction/native.py lists them (`CORE_SOURCES`, `MODEL_SOURCES`). Building them is
best effort: where Cython or a C compiler is missing (`CC=false pip install -e .`), the install
still succeeds, says why in one line, and sage runs the pure-Python code.

Built modules are cached by the hash of what they are built from (every .pyx, .pxi and .pxd
source, the Cython version, the interpreter's extension suffix and the compile flags), under
`$SAGE_BUILD_CACHE` (default `~/.cache/sage-kv/build`): an install whose sources match a cached
build copies it instead of compiling again, so `pip install -e '.[extra]'` for one more extra
takes seconds rather than minutes. `SAGE_BUILD_CACHE=off` compiles every time.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# sage_eviction/native.py lists the compiled modules once, for the build and for the runtime that
# loads them; it is read by path (sage is not importable in pip's isolated build environment) and
# imports nothing but the standard library.
_NATIVE = runpy.run_path(str(ROOT / "sage_eviction" / "native.py"), run_name="sage_native")

NATIVE_MODULES: dict[str, str] = {**_NATIVE["CORE_SOURCES"], **_NATIVE["MODEL_SOURCES"]}
"""Module name -> Cython source (relative to the repository root): everything setup.py builds."""

INCLUDE_PATH = ["sage_eviction"]
"""Where a source's `include` looks after its own folder: the policies' core's int64 table and
lists (sage_eviction/_core_i64map.pxi, _core_flat_lists.pxi) serve the ghost set too, one source."""


COMPILE_ARGS = ["-O3"]


def _source_hash() -> str:
    """The hash of everything a build of the modules depends on (see the module docstring)."""
    try:
        import Cython

        cython_version = Cython.__version__
    except ImportError:
        cython_version = "none"
    digest = hashlib.sha256()
    for part in (sysconfig.get_config_var("EXT_SUFFIX") or "", cython_version, " ".join(COMPILE_ARGS)):
        digest.update(part.encode() + b"\0")
    digest.update(repr(sorted(NATIVE_MODULES.items())).encode())
    sources = sorted(
        path
        for folder in ("sage_eviction", "engine_adapter")
        for pattern in ("*.pyx", "*.pxi", "*.pxd")
        for path in (ROOT / folder).rglob(pattern)
    )
    for path in sources:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _cache_dir() -> Path | None:
    """This source hash's folder of built modules, or None when caching is off."""
    where = os.environ.get("SAGE_BUILD_CACHE", "")
    if where.lower() in ("off", "0", "no"):
        return None
    base = Path(where) if where else Path.home() / ".cache" / "sage-kv" / "build"
    return base / _source_hash()


class OptionalBuildExt(build_ext):
    """build_ext that copies a cached build of matching sources, and warns and goes on when an
    extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (distutils raises several kinds)
            _skip("the compiled core", exc)

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        target = Path(self.get_ext_fullpath(ext.name))
        cache = _cache_dir()
        cached = None if cache is None else cache / _cached_name(ext.name)
        if cached is not None and cached.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(cached, target)
            print(f"sage: {ext.name} from the build cache ({cache})", file=sys.stderr)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:
            _skip(ext.name, exc)
            return
        if cached is not None and target.is_file():
            _store(target, cached)


def _store(built: Path, cached: Path) -> None:
    """Copy a built module into the cache (atomically: a concurrent build reads all or nothing)."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}")
        shutil.copy2(built, partial)
        os.replace(partial, cached)
    except OSError as exc:  # a read-only home: the build stands, only the cache is skipped
        print(f"sage: build cache not written ({exc})", file=sys.stderr)


def _skip(what: str, exc: BaseException) -> None:
    print(f"sage: {what} not built ({type(exc).__name__}: {exc}); the pure-Python code runs", file=sys.stderr)


def _all_cached() -> bool:
    """Whether the cache holds every module for these sources (then nothing is cythonized)."""
    cache = _cache_dir()
    return cache is not None and all((cache / _cached_name(name)).is_file() for name in NATIVE_MODULES)


def _cached_name(module: str) -> str:
    """A module's file in the cache: its dotted name (two modules are called `_core`)."""
    return module + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def _extensions() -> list[object]:
    if not NATIVE_MODULES:
        return []
    from setuptools import Extension

    modules = [
        Extension(name, [source], extra_compile_args=COMPILE_ARGS) for name, source in NATIVE_MODULES.items()
    ]
    if _all_cached():
        return list(modules)  # `OptionalBuildExt` copies each from the cache: no Cython, no compiler
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        _skip("the compiled core", exc)
        return []
    directives = {"boundscheck": False, "wraparound": False}
    built = cythonize(modules, language_level=3, compiler_directives=directives, include_path=INCLUDE_PATH)
    return list(built)


if __name__ == "__main__":  # pip's backend and `python setup.py` both run it as __main__; tests import it
    setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
