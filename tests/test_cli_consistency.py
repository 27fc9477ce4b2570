"""One argument style and readable help across the CLI (issue 48, item 11), as real processes:

- ``set-policy NAME`` takes the policy positionally, as ``set-token-policy SPEC`` does (and as
  docs/howto.md writes it); the old ``--policy NAME`` works for one release, with a warning;
- ``engine start --help`` and ``benchmark --help`` list their options in panels (Typer's
  ``rich_help_panel``), every option in one, instead of one flat list of 180 lines;
- ``sage llm eviction policies`` shows each policy's idea, and its source as authors and venue,
  not a paper title wrapped over five lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sage_cli.benchmark.options import BENCHMARK_PANELS
from sage_cli.engine.start import START_PANELS
from sage_cli.eviction.render import short_source
from sage_eviction import describe_policies

ROOT = Path(__file__).resolve().parent.parent


def _sage(*args: str) -> subprocess.CompletedProcess[str]:
    home = tempfile.mkdtemp(prefix="sg-cc-", dir="/tmp")  # no engine runs there
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=home, PYTHONPATH=str(ROOT), COLUMNS="100")
    command = [sys.executable, "-m", "sage_cli.app", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_set_policy_takes_the_name_positionally() -> None:
    done = _sage("llm", "eviction", "set-policy", "arc")
    assert done.returncode == 3, done.stderr  # parsed: it went on to look for an engine
    assert done.stderr.startswith("Error: no engine running on") and "warning" not in done.stderr


def test_the_old_policy_option_still_works_with_a_warning() -> None:
    done = _sage("llm", "eviction", "set-policy", "--policy", "arc")
    assert done.returncode == 3, done.stderr
    warning, error = done.stderr.strip().splitlines()
    assert warning == (
        "warning: --policy is deprecated and goes in the next release; write "
        "`sage llm eviction set-policy arc`"
    )
    assert error.startswith("Error: no engine running on")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "Missing argument 'NAME'"),
        (["arc", "--policy", "lru"], "two policies given ('arc' and --policy 'lru'); give one NAME"),
    ],
)
def test_set_policy_without_one_clear_name_is_a_usage_error(args: list[str], needle: str) -> None:
    done = _sage("llm", "eviction", "set-policy", *args)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and needle in last and "Traceback" not in done.stderr


def _sections(help_text: str) -> dict[str, list[str]]:
    """The help's sections: title -> the option names that start its lines."""
    sections: dict[str, list[str]] = {}
    title = None
    for line in help_text.splitlines():
        if re.match(r"^[A-Z][^:]*:$", line):
            title = line[:-1]
            sections[title] = []
        elif title and re.match(r"^  -", line):
            sections[title].append(line.split()[0])
    return sections


@pytest.mark.parametrize(
    ("command", "panels"),
    [(["llm", "engine", "start"], START_PANELS), (["llm", "benchmark"], BENCHMARK_PANELS)],
)
def test_long_help_is_grouped_into_panels(command: list[str], panels: dict[str, str]) -> None:
    done = _sage(*command, "--help")
    assert done.returncode == 0, done.stderr
    sections = _sections(done.stdout)
    titles = list(dict.fromkeys(panels.values()))
    assert [t for t in sections if t not in ("Arguments", "Options")] == titles
    assert sections["Options"] == ["-h,"]  # every option but --help sits in a panel
    assert all(sections[t] for t in titles)  # no empty panel (a stale name)


def test_every_option_has_a_panel_and_every_panel_name_an_option() -> None:
    import typer

    from sage_cli.app import build_command

    root = build_command()
    for path, panels in (
        (("llm", "engine", "start"), START_PANELS),
        (("llm", "benchmark"), BENCHMARK_PANELS),
    ):
        command = root
        for word in path:
            command = command.commands[word]  # type: ignore[attr-defined]
        names = {p.name for p in command.params if isinstance(p, typer.core.TyperOption)} - {"help"}
        assert names == set(panels), (path, sorted(names ^ set(panels)))


def test_the_policies_table_shows_the_idea_and_a_short_source() -> None:
    done = _sage("llm", "eviction", "policies")
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "Policy" in line)
    assert "Idea" in header and "Source" in header
    assert "ARC over blocks: T1/T2 resident lists," in done.stdout  # the idea, at 100 columns
    assert "Megiddo and Modha," in done.stdout and "Self-Tuning" not in done.stdout  # no title
    # as many lines as the table had without the idea column, whose paper titles took 3 to 4 each
    assert len(done.stdout.splitlines()) <= 60


def test_short_sources_keep_authors_and_venue() -> None:
    sources = {p["name"]: short_source(p["paper"]) for p in describe_policies(include_offline=True)}
    assert sources["arc"] == "Megiddo and Modha, FAST 2003"
    assert sources["lfu"] == "Aho, Denning and Ullman, JACM 1971"
    assert sources["s3fifo"] == "Yang et al., SOSP 2023"
    assert all(len(source) <= 80 for source in sources.values()), sources
