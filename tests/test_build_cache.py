"""setup.py's build cache (issue 48, item 10): an install whose Cython sources match a cached
build copies the compiled modules instead of compiling them again, so ``pip install -e
'.[extra]'`` for one more extra does not spend minutes on the core.

The cache is seeded with this checkout's compiled modules under the hash setup.py computes for
its sources; `setup.py build_ext` then runs as a real process with no compiler (``CC=false``)
and must produce exactly those modules, from the cache.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = runpy.run_path(str(REPO / "setup.py"), run_name="sage_setup")  # its functions, no build
MODULES: dict[str, str] = SETUP["NATIVE_MODULES"]


def _built(module: str) -> Path | None:
    """This checkout's compiled module (built in place), or None."""
    folder = REPO / Path(*module.split(".")[:-1])
    found = sorted(folder.glob(module.rsplit(".", 1)[-1] + ".*.so"))
    return found[0] if found else None


@pytest.mark.slow  # setup.py in a process of its own: seconds
@pytest.mark.skipif(
    any(_built(m) is None for m in MODULES), reason="the compiled core is not built in this checkout"
)
def test_matching_sources_are_copied_from_the_cache_without_compiling(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "SAGE_BUILD_CACHE": str(cache), "CC": "false", "CXX": "false", "LDSHARED": "false"}
    folder = cache / SETUP["_source_hash"]()
    folder.mkdir(parents=True)
    for module in MODULES:
        built = _built(module)
        assert built is not None
        shutil.copy2(built, folder / SETUP["_cached_name"](module))
    out = tmp_path / "lib"
    build = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out)]
    build += ["--build-temp", str(tmp_path / "temp")]
    done = subprocess.run(build, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("from the build cache") == len(MODULES), done.stderr
    for module in MODULES:
        built = _built(module)
        assert built is not None
        copied = out / Path(*module.split(".")[:-1]) / built.name
        assert copied.read_bytes() == built.read_bytes(), module


def test_the_hash_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any .pyx/.pxi/.pxd byte changes the key (a copy of the sources is edited, not these);
    SAGE_BUILD_CACHE=off turns the cache off."""
    _copy_setup(tmp_path)
    for folder in ("sage_eviction", "engine_adapter"):
        for pattern in ("*.pyx", "*.pxi", "*.pxd"):
            for path in (REPO / folder).rglob(pattern):
                target = tmp_path / path.relative_to(REPO)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    copy = runpy.run_path(str(tmp_path / "setup.py"), run_name="sage_setup")
    before = copy["_source_hash"]()
    assert before == SETUP["_source_hash"]()  # the same sources, the same key
    (tmp_path / "sage_eviction" / "_core_heap.pxi").write_text("# one more line\n", encoding="utf-8")
    assert copy["_source_hash"]() != before
    monkeypatch.setenv("SAGE_BUILD_CACHE", "off")
    assert copy["_cache_dir"]() is None
    monkeypatch.setenv("SAGE_BUILD_CACHE", str(tmp_path / "cache"))
    assert copy["_cache_dir"]() == tmp_path / "cache" / copy["_source_hash"]()


def _copy_setup(into: Path) -> None:
    """setup.py and the one file it reads the module list from, as the build sees them."""
    shutil.copy2(REPO / "setup.py", into / "setup.py")
    (into / "sage_eviction").mkdir(exist_ok=True)
    shutil.copy2(REPO / "sage_eviction" / "native.py", into / "sage_eviction" / "native.py")


def test_setup_builds_what_native_loads_listed_once(tmp_path: Path) -> None:
    """native.py's source tables are the one list (issue 50, item 6): setup.py builds each module
    the runtime loads, every .pyx in the tree is in it, and a module added to native.py alone (in
    a copy) is one more that setup.py builds."""
    from sage_eviction import native

    assert tuple(MODULES) == native.NATIVE_MODULES + native.MODEL_MODULES
    pyx = {
        str(p.relative_to(REPO))
        for folder in ("sage_eviction", "engine_adapter")
        for p in (REPO / folder).rglob("*.pyx")
    }
    assert set(MODULES.values()) == pyx
    _copy_setup(tmp_path)
    listed = tmp_path / "sage_eviction" / "native.py"
    text = listed.read_text(encoding="utf-8")
    anchor = "MODEL_SOURCES: dict[str, str] = {\n"
    assert anchor in text
    listed.write_text(
        text.replace(anchor, anchor + '    "engine_adapter.model._new": "engine_adapter/model/_new.pyx",\n')
    )
    copy = runpy.run_path(str(tmp_path / "setup.py"), run_name="sage_setup")
    assert copy["NATIVE_MODULES"] == {**MODULES, "engine_adapter.model._new": "engine_adapter/model/_new.pyx"}
