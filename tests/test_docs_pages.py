"""The documentation pages read as a new user meets them (issue 48, item 12): a page that points
at another page links to it (the site showed ``docs/architecture.md`` as plain text), no
``# doctest: +SKIP`` shows in an example on the API pages, the ``--api-key`` minimum of 16
characters is said, and what the docs site and the examples write when run from a clone is
ignored by git rather than left untracked in it. (tests/test_docs_site.py builds the site
strictly, so the links and their anchors resolve.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.sim import api as sim_api
from sage_cli import client, records

ROOT = Path(__file__).resolve().parent.parent
# A page named as a path in running text, not a link: "docs/x.md" not inside (...) or [...].
PLAIN_REFERENCE = re.compile(r"(?<![(/\[\w])docs/[\w/-]+\.md")


def _site_pages() -> list[Path]:
    pages = sorted((ROOT / "docs").rglob("*.md"))
    return [
        p for p in pages if "reference" not in p.relative_to(ROOT / "docs").parts and p.name != "README.md"
    ]


def test_pages_link_the_pages_they_name() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in _site_pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if PLAIN_REFERENCE.search(line)
    ]
    assert found == [], "\n".join(found)
    assert PLAIN_REFERENCE.search('("Tiers" in docs/architecture.md)')
    assert not PLAIN_REFERENCE.search("[Tiers](../architecture.md#tiers) and [x](docs/x.md)")


@pytest.mark.parametrize("module", [client, records, sim_api])
def test_examples_on_the_api_pages_show_no_doctest_directive(module: object) -> None:
    assert "doctest:" not in (module.__doc__ or "")


def test_the_api_key_minimum_is_documented() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sage_cli.app", "llm", "engine", "start", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )  # fmt: skip
    text = " ".join(done.stdout.split())
    assert "--api-key KEY Key every TCP request must send as 'Authorization: Bearer KEY'" in text
    assert "($SAGE_API_KEY): 16 printable characters at least, no spaces." in text
    assert "16 printable characters at least" in (ROOT / "docs/concepts/engine.md").read_text()


def test_site_and_example_outputs_are_ignored_by_git() -> None:
    outputs = ["site/index.html", "compare_policies.png", "mooncake.png", "examples/custom_policy/x.png"]
    done = subprocess.run(["git", "check-ignore", *outputs], cwd=ROOT, capture_output=True, text=True)
    assert done.stdout.split() == outputs
    kept = subprocess.run(["git", "check-ignore", "docs/img/mooncake.png"], cwd=ROOT, capture_output=True)
    assert kept.returncode == 1  # the README's figure is tracked
