"""A green CI run means the thing was tested (tests/conftest.py, `SAGE_REQUIRE_ALL`).

The conftest is copied beside a few small tests into a temporary folder and run by a real pytest
process, with and without ``SAGE_REQUIRE_ALL=1``: a skip for something missing fails under it, an
allowed skip (no GPU) does not, and a missing requirement stops the session before any test,
naming it. Without it the same skips stay skips (a developer's partial install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three pytest processes, about 5 s

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest

def test_runs():
    assert True

def test_needs_a_missing_extra():
    pytest.importorskip("sage_no_such_extra")

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
    (tmp_path / "test_sample.py").write_text(SAMPLE, encoding="utf-8")
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SAGE_REQUIRE_ALL"}
    env.update(extra)
    return env


def test_without_require_all_a_missing_extra_skips(sample: Path) -> None:
    result = _run(sample, _env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 2 skipped" in result.stdout


def test_under_require_all_a_missing_extra_fails_and_a_gpu_skip_stays(sample: Path) -> None:
    if shutil.which("dot") is None:  # the session check would stop first; .ci/run installs it
        pytest.skip("Graphviz's dot is not installed (.ci/run installs it)")
    result = _run(sample, _env(SAGE_REQUIRE_ALL="1"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed, 1 passed, 1 skipped" in result.stdout
    assert "skipped under SAGE_REQUIRE_ALL=1" in result.stdout
    assert "sage_no_such_extra" in result.stdout


def test_under_require_all_a_missing_requirement_stops_the_session(sample: Path) -> None:
    # Hide the compiled core: the session must stop before any test and name it.
    result = _run(sample, _env(SAGE_REQUIRE_ALL="1", SAGE_PURE_PYTHON="1"))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "the compiled core sage_eviction._core" in result.stdout + result.stderr
    assert "passed" not in result.stdout
