"""The committed completions and man pages are what `scripts/gen_cli_docs.py` makes of the CLI now,
and they work: bash (always), fish, zsh and groff when they are installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "python scripts/gen_cli_docs.py"
GENERATED = ["completions/sage.bash", "completions/_sage", "completions/sage.fish"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    return out


def relative_files(folder: Path) -> set[str]:
    found = {str(p.relative_to(folder)) for p in (folder / "completions").glob("*")}
    return found | {str(p.relative_to(folder)) for p in (folder / "man").glob("*.1")}


def test_committed_files_are_up_to_date(generated: Path) -> None:
    expected = relative_files(generated)
    assert set(GENERATED) <= expected
    assert {"man/sage.1", "man/sage-llm-engine-start.1", "man/sage-llm-eviction-stats.1"} <= expected
    missing = sorted(expected - relative_files(ROOT))
    stray = sorted(p for p in relative_files(ROOT) - expected if p.startswith("man/sage"))
    stale = sorted(
        rel
        for rel in expected & relative_files(ROOT)
        if (ROOT / rel).read_bytes() != (generated / rel).read_bytes()
    )
    assert not (missing or stray or stale), (
        f"CLI docs out of date (missing {missing}, stray {stray}, stale {stale}); "
        f"regenerate with: {REGENERATE}"
    )


def test_every_command_and_option_is_documented(generated: Path) -> None:
    from sage_cli.app import build_command

    bash = (generated / "completions/sage.bash").read_text()
    fish = (generated / "completions/sage.fish").read_text()

    def walk(command: object, path: list[str]) -> None:
        slug = "-".join(["sage", *path])
        page = (generated / "man" / f"{slug}.1").read_text()
        for param in getattr(command, "params", []):
            for opt in param.opts if param.param_type_name == "option" else []:
                assert opt.replace("-", "\\-") in page, (slug, opt)
                assert f'"{" ".join(["sage", *path])}:{opt}"' in bash or opt in bash, (slug, opt)
                flag = f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
                assert flag in fish, (slug, opt)
        for name, child in (getattr(command, "commands", None) or {}).items():
            walk(child, [*path, name])

    walk(build_command(), [])


def run_bash_completion(words: list[str]) -> list[str]:
    script = (
        f"source {ROOT / 'completions/sage.bash'}\n"
        'COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); _sage\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        ["bash", "-c", script, "bash", *words],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        cwd=ROOT,
    )
    return [line for line in result.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion() -> None:
    assert run_bash_completion(["sage", ""]) == ["llm"]
    assert run_bash_completion(["sage", "llm", ""]) == ["benchmark", "engine", "eviction"]
    assert run_bash_completion(["sage", "llm", "engine", ""]) == ["start", "status", "stop"]
    evict_s = ["set-policy", "set-token-policy", "stats"]
    assert run_bash_completion(["sage", "llm", "eviction", "s"]) == evict_s
    assert run_bash_completion(["sage", "llm", "engine", "start", "--devi"]) == ["--device"]
    assert run_bash_completion(["sage", "llm", "engine", "start", "--device", ""]) == ["auto", "cpu", "cuda"]
    assert run_bash_completion(["sage", "llm", "benchmark", "--mode", ""]) == ["sim", "engine"]
    # An option's value: nothing to offer for a number; then the command's options again.
    assert run_bash_completion(["sage", "llm", "eviction", "stats", "--interval", ""]) == []
    assert "--watch" in run_bash_completion(["sage", "llm", "eviction", "stats", "--name", "x", "--"])


@pytest.mark.skipif(shutil.which("fish") is None, reason="no fish")
def test_fish_completion() -> None:
    def complete(line: str) -> list[str]:
        script = f"source {ROOT / 'completions/sage.fish'}; complete -C '{line}'"
        result = subprocess.run(
            ["fish", "-c", script], capture_output=True, text=True, timeout=30, check=True
        )
        return sorted(line.split("\t")[0] for line in result.stdout.splitlines())

    assert complete("sage llm ") == ["benchmark", "engine", "eviction"]
    assert complete("sage llm engine start --device ") == ["auto", "cpu", "cuda"]
    assert "--watch" in complete("sage llm eviction stats --")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="no zsh")
def test_zsh_completion_parses() -> None:
    subprocess.run(["zsh", "-n", str(ROOT / "completions/_sage")], check=True, timeout=30)


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff")
def test_man_pages_render_without_warnings() -> None:
    for page in sorted((ROOT / "man").glob("sage*.1")):
        result = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True, timeout=30
        )
        assert (result.returncode, result.stderr) == (0, ""), page.name
