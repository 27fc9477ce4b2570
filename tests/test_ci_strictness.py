"""A green CI run means the thing was tested (tests/conftest.py, `SAGE_REQUIRE_ALL`).

The conftest is copied beside a few small tests into a temporary folder and run by a real pytest
process, with and without ``SAGE_REQUIRE_ALL=1``: a skip for something missing fails under it, an
allowed skip (no GPU) does not, and a missing requirement (the compiled core, an extra) stops the
session before any test, naming it. Without it the same skips stay skips (a developer's partial
install). The skip hooks are also run on their own, without the session check, so that they are
tested on a machine that lacks a program .ci/run installs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing_requirements

pytestmark = pytest.mark.slow  # five pytest processes, about 8 s

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest
from lazy_extras import lazy

missing_lazily = lazy("sage_no_such_lazy_extra")  # collected without importing it

def test_runs():
    assert True

def test_needs_a_missing_extra():
    pytest.importorskip("sage_no_such_extra")

def test_needs_a_missing_extra_lazily():
    missing_lazily.anything

def test_needs_a_gpu():
    pytest.skip("needs CUDA")
'''


def _run(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    shutil.copy(TESTS / "lazy_extras.py", tmp_path / "lazy_extras.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SAGE_REQUIRE_ALL"}
    env.update(extra)
    return env


def test_without_require_all_a_missing_extra_skips(sample: Path) -> None:
    result = _run(sample, _env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 3 skipped" in result.stdout


def test_under_require_all_a_missing_extra_fails_and_a_gpu_skip_stays(sample: Path) -> None:
    lacking = missing_requirements()
    if lacking:  # the session check would stop first; the test below runs the hooks without it
        pytest.skip(f"this machine lacks {'; '.join(lacking)}")
    result = _run(sample, _env(SAGE_REQUIRE_ALL="1"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 passed, 1 skipped" in result.stdout
    assert "skipped under SAGE_REQUIRE_ALL=1" in result.stdout
    assert "sage_no_such_extra" in result.stdout


def test_under_require_all_a_missing_requirement_stops_the_session(sample: Path) -> None:
    # Hide the compiled core: the session must stop before any test and name it.
    result = _run(sample, _env(SAGE_REQUIRE_ALL="1", SAGE_PURE_PYTHON="1"))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "the compiled core sage_eviction._core" in result.stdout + result.stderr
    assert "passed" not in result.stdout


# The suite's conftest without its session check: only the skip hooks, whatever this machine lacks.
SKIP_HOOKS_ONLY = """
from real_conftest import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
"""


def test_under_require_all_the_skip_hooks_fail_a_missing_extra_and_keep_a_gpu_skip(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "real_conftest.py")
    shutil.copy(TESTS / "lazy_extras.py", tmp_path / "lazy_extras.py")
    (tmp_path / "conftest.py").write_text(SKIP_HOOKS_ONLY, encoding="utf-8")
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    result = _run(tmp_path, _env(SAGE_REQUIRE_ALL="1"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 passed, 1 skipped" in result.stdout
    assert "skipped under SAGE_REQUIRE_ALL=1, where nothing may be missing" in result.stdout
    assert "SKIPPED [1] test_sample.py:17: needs CUDA" in result.stdout
    # the same hooks without SAGE_REQUIRE_ALL: both skips stay skips
    assert "1 passed, 3 skipped" in _run(tmp_path, _env()).stdout


def test_under_require_all_a_missing_extra_stops_the_session(sample: Path) -> None:
    # A sitecustomize makes kvpress unimportable, as on a machine where its extra did not install.
    hide = sample / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['kvpress'] = None\n", encoding="utf-8")
    path = os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])
    result = _run(sample, _env(SAGE_REQUIRE_ALL="1", PYTHONPATH=path))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "kvpress (the kvpress extra)" in result.stdout + result.stderr
    assert "passed" not in result.stdout
