"""``sage llm engine start`` with a model or device it cannot use (issue 48, item 7): one line that
says what is wrong, exit non-zero, and no hint at an option that does not exist.

Before: a missing ``nope.gguf`` was "not a .gguf file"; a Hugging Face name not in the local cache
showed only the last line of its message (losing "not in the local Hugging Face cache; sage never
downloads"); that message suggested ``--model`` (MODEL is positional); ``--device cuda`` on a
CPU-only torch ended in ``AssertionError: Torch not compiled with CUDA enabled``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from engine_adapter.model.loader import ModelLoadError, load_model

REPO = Path(__file__).resolve().parent.parent


def test_a_missing_gguf_file_is_no_such_file(tmp_path: Path) -> None:
    for name in ("nope.gguf", str(tmp_path / "models" / "nope.gguf"), "models/nope.gguf"):
        with pytest.raises(ModelLoadError, match="no such file"):
            load_model(name, device="cpu")


def test_the_cache_message_names_the_real_way_to_pass_a_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError) as caught:
        load_model("someorg/somemodel", device="cpu")
    assert "--model" not in str(caught.value)
    assert "sage llm engine start /path/to/folder" in str(caught.value)


def test_no_error_or_example_suggests_a_model_option() -> None:
    """`sage llm engine start` takes MODEL as an argument: nothing the user reads says --model
    (benchmarks/ scripts have their own --model option, and are not about the engine command)."""
    from sage_cli.engine.start_options import START_OPTIONS

    assert not [f for f in START_OPTIONS if "--model" in f.decls]
    said = re.compile(r"--model\b(?!-)")
    folders = ["engine_adapter", "sage_cli", "examples", "docs"]
    found = [
        f"{path.relative_to(REPO)}"
        for folder in folders
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in (".py", ".md") and said.search(path.read_text(encoding="utf-8"))
    ]
    assert found == [] or all(p.startswith("docs/benchmarks/") for p in found), found


def _start(*args: str) -> subprocess.CompletedProcess[str]:
    home = tempfile.mkdtemp(prefix="sg-err-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=home, PYTHONPATH=str(REPO), HF_HUB_CACHE=home, HF_HOME=home)
    command = [
        sys.executable,
        "-m",
        "sage_cli.app",
        "llm",
        "engine",
        "start",
        *args,
        "--detach",
        "--name",
        "e",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=home)


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.slow  # each starts an engine process that fails while loading
def test_start_says_what_is_wrong_with_the_model() -> None:
    assert "'nope.gguf': no such file" in _one_line_error(_start("nope.gguf"))
    line = _one_line_error(_start("someorg/somemodel"))
    assert "not in the local Hugging Face cache; sage never downloads weights" in line
    assert "Download it yourself" in line and "--model" not in line  # the whole message, one line


@pytest.mark.slow  # the CLI's start, up to the device check, imports the engine's config and torch
@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch has CUDA")
def test_start_on_cuda_with_a_cpu_only_torch_is_one_clear_line() -> None:
    line = _one_line_error(_start("sage-tiny", "--device", "cuda"))
    assert "--device cuda: this torch" in line and "CPU-only build" in line and "--device cpu" in line
    assert "AssertionError" not in line
