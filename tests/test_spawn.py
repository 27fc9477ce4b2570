"""`sage_cli.spawn`: the one way the CLI starts an engine in the background, as real processes.

A temporary engine answers on its private socket, the control client resets its cache, and
stopping it leaves no process, no folder and no open log handle in the parent.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sage_cli.client import ControlClient
from sage_cli.errors import CLIError
from sage_cli.spawn import TemporaryEngine, spawn_engine

pytestmark = pytest.mark.slow


def _open_files() -> set[str]:
    fd_dir = Path("/proc/self/fd")
    found = set()
    for fd in fd_dir.iterdir():
        try:
            found.add(os.readlink(fd))
        except OSError:
            continue
    return found


def test_a_temporary_engine_answers_resets_and_leaves_nothing_behind() -> None:
    config = {"model": "sage-tiny", "device": "cpu", "num_blocks": 64, "block_size": 4}
    with TemporaryEngine(config, timeout=120) as engine:
        folder, process = engine.folder, engine.engine.process
        assert str(engine.engine.log_path) not in _open_files()  # the child has it, not us
        assert stat.S_IMODE(engine.engine.log_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(engine.engine.log_path.parent.stat().st_mode) == 0o700
        with ControlClient(engine.socket) as client:
            answer = client.complete({"prompt": "Hello, cache", "max_tokens": 2})
            assert answer["choices"][0]["finish_reason"] in {"stop", "length"}
            assert client.eviction_stats()["cached_blocks"] > 0
            client.reset_cache()
            assert client.eviction_stats()["cached_blocks"] == 0
            chunks = list(client.stream_completion({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}))
            assert sum(1 for c in chunks for choice in c["choices"] if choice.get("text")) >= 1
    assert process.poll() is not None
    assert not folder.exists()


def test_an_engine_that_cannot_start_is_a_one_line_error_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with pytest.raises(CLIError, match=r"exited with code \d+ while starting") as err:
        spawn_engine(
            '{"model": "no-such-model", "device": "cpu"}',
            socket=tmp_path / "s.sock",
            log_path=log,
            timeout=60,
        )
    assert str(log) in str(err.value) and "\n" not in str(err.value)
