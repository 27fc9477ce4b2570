"""An in-process engine behind Starlette's TestClient, for the tests of the HTTP API.

The tests of the control API, of embeddings and of colocation each run one engine per module
with their own config; this is the one place that starts it, drains nothing on the way out,
and builds the client (a 500 comes back as JSON, as a real client sees it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from engine_adapter.cache.contract import CacheContract
from engine_adapter.serving.app import build_app
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine


@contextmanager
def running_engine(config: Callable[[Path], EngineConfig], prefix: str) -> Iterator[Engine]:
    """A started engine whose socket and logs live in a fresh temporary folder."""
    with tempfile.TemporaryDirectory(prefix=prefix, dir="/tmp") as root:
        engine = Engine(config(Path(root)))
        engine.start()
        try:
            yield engine
        finally:
            engine.shutdown(drain=False, timeout=10)


@contextmanager
def serving(**overrides: object) -> Iterator[Engine]:
    """`started_engine(**overrides)`, shut down without draining on the way out."""
    engine = started_engine(**overrides)
    try:
        yield engine
    finally:
        engine.shutdown(drain=False, timeout=10)


def app_client(engine: Engine) -> TestClient:
    """The engine's HTTP app; server errors come back as responses, not exceptions."""
    return TestClient(build_app(engine), raise_server_exceptions=False)


def started_engine(**overrides: object) -> Engine:
    """A started sage-tiny engine on the CPU with 4-token blocks and a large pool; `overrides`
    are EngineConfig fields. Its socket path is never bound: tests submit to it directly."""
    values: dict[str, object] = {
        "device": "cpu",
        "block_size": 4,
        "num_blocks": 4096,
        "name": "test",
        "socket": "/tmp/sage-test-unused.sock",
        "max_num_batched_tokens": 64,
    }
    values.update(overrides)
    engine = Engine(EngineConfig(**values))  # type: ignore[arg-type]
    engine.start()
    return engine


class SubmitRecorder:
    """Stands in for an engine's ``submit`` (monkeypatched on it) and records the prompt (text or
    token ids) and the `CacheContract` each request was handed, then submits it to the real
    engine, which serves it."""

    def __init__(self, engine: Engine) -> None:
        self.contracts: list[CacheContract | None] = []
        self.prompts: list[Any] = []
        self._submit = engine.submit

    @classmethod
    def installed(cls, engine: Engine, monkeypatch: Any) -> SubmitRecorder:
        """A recorder put in place of `engine.submit` for one test (`monkeypatch` undoes it)."""
        recorder = cls(engine)
        monkeypatch.setattr(engine, "submit", recorder)
        return recorder

    def __call__(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        self.contracts.append(kwargs.get("cache_contract"))
        self.prompts.append(getattr(prompt, "ids", prompt))  # a rendered chat: its token ids
        return self._submit(prompt, *args, **kwargs)
