"""The documentation site (issue 29): `mkdocs build --strict` over mkdocs.yml, its generated
reference pages current, every public name of the policy library on its API page, the README's
sections as its pages (the setup on the home page, the policy table on the policies page), and a
broken link failing the build (so a green build means the links hold).

Needs the docs extra (mkdocs-material, mkdocstrings-python): without it these fail, never skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sage_eviction
from engine_adapter.sim import api as sim_api
from sage_cli import client, records

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gen_site_docs  # noqa: E402

# The public Python faces and their API pages (docs/reference/): every name in `__all__` has an
# entry with its docstring (mkdocstrings renders no entry for a name without one).
API_PAGES = [
    ("sage_eviction", sage_eviction),
    ("simulator", sim_api),
    ("client", client),
    ("client", records),
]


def _build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_generated_reference_pages_are_current() -> None:
    for rel, text in gen_site_docs.render_all().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run {gen_site_docs.REGENERATE}"


def test_the_cli_page_names_every_command() -> None:
    from sage_cli.app import build_command

    root = gen_site_docs.build_tree(build_command())
    page = (ROOT / "docs/reference/cli.md").read_text()
    for node in root.walk():
        assert f"`{node.words}`" in page


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_public_name(tmp_path: Path) -> None:
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    for page, module in API_PAGES:
        api = (tmp_path / f"site/reference/{page}/index.html").read_text()
        documented = set(re.findall(rf'id="{re.escape(module.__name__)}\.(\w+)"', api))
        public = {n for n in module.__all__ if not n.startswith("__")}  # __version__ is metadata
        missing = sorted(public - documented)
        assert not missing, f"public names of {module.__name__} without an entry on its API page: {missing}"
    home = re.sub(r"<[^>]+>", "", (tmp_path / "site/index.html").read_text())
    assert "Install and run" in home and "dist loadfile" in home  # the README's two commands
    assert 'src="img/mooncake.png"' in (tmp_path / "site/index.html").read_text()
    # the policy table lives in the README; the policies page includes it (a snippet section)
    policies = (tmp_path / "site/concepts/policies/index.html").read_text()
    rows = set(re.findall(r"<td><code>(\w+)</code></td>", policies))
    missing = sorted(set(sage_eviction.available_policies()) - rows)
    assert not missing, f"policies the site's policy table lacks: {missing}"


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("docs", "sage_eviction", "sage_cli"):
        skip = shutil.ignore_patterns("__pycache__", "*.so")
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip)
    howto = tmp_path / "docs/howto.md"
    howto.write_text(howto.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr
