"""One owner for torch (docs/architecture.md, "Threads"): the engine thread, and `--threads`.

libgomp keeps an OpenMP team per thread that runs a parallel region, so a torch call from the
main thread, an `asyncio.to_thread` worker or a waiter would start a second team fighting the
engine's for the cores. The first test watches every torch call the process makes (a profile
hook on every thread: a call of a builtin of torch or of a tensor's method) while a real
engine is built, loaded and served over its HTTP app (completions streamed and whole, chats,
embeddings, and every control endpoint), and asserts one thread made them all: the engine's.

The rest: `EngineThread` itself, and the ``threads`` key (its values, the warnings when
``OMP_NUM_THREADS``, the cores or torch's own setting disagree, and where they are shown).
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from engine_fixtures import app_client

from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.engine_thread import EngineThread, usable_cores
from engine_adapter.token_eviction.pressure import MemoryStats, SystemMonitor
from sage_cli.engine.status import render_status

SHARED = "The quick brown fox jumps over the lazy dog while the cat watches. "


def _config(root: Path, **overrides: Any) -> EngineConfig:
    values: dict[str, Any] = {
        "num_blocks": 64,
        "block_size": 8,
        "device": "cpu",
        "name": "threads",
        "socket": str(root / "t.sock"),
        "log_dir": str(root / "logs"),
    }
    values.update(overrides)
    return EngineConfig(**values)


def _is_torch(fn: Any) -> bool:
    """A builtin of torch (``torch.zeros``, ``torch._C._nn.linear``) or a tensor's method."""
    module = getattr(fn, "__module__", None) or ""
    if module == "torch" or module.startswith("torch."):
        return True
    return isinstance(getattr(fn, "__self__", None), torch.Tensor)


class TorchCalls:
    """Every torch call of every thread while `watch` is on: thread ident -> the calls' names."""

    def __init__(self) -> None:
        self.by_thread: dict[int, list[str]] = {}
        self.names: dict[int, str] = {}
        self.on = False

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and self.on and _is_torch(arg):
            ident = threading.get_ident()
            self.names.setdefault(ident, threading.current_thread().name)
            self.by_thread.setdefault(ident, []).append(getattr(arg, "__qualname__", repr(arg)))

    @contextmanager
    def watch(self) -> Iterator[TorchCalls]:
        """On for this thread and every thread started meanwhile (the engine thread, the app's
        workers); threads started before would go unseen, so nothing of torch runs in one."""
        self.on = True
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        try:
            yield self
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            self.on = False

    def summary(self) -> str:
        return "; ".join(
            f"{self.names[t]}: {len(calls)} calls, first {sorted(set(calls))[:6]}"
            for t, calls in self.by_thread.items()
        )


class ThreadsOfMonitor:
    """The engine's memory monitor, noting the thread of each read (on CUDA a torch call)."""

    def __init__(self, monitor: SystemMonitor) -> None:
        self.monitor = monitor
        self.idents: set[int] = set()

    def mem_stats(self) -> MemoryStats:
        self.idents.add(threading.get_ident())
        return self.monitor.mem_stats()


def _serve_everything(engine: Engine) -> None:
    """Completions (whole and streamed), a chat, embeddings and every control endpoint."""
    client = app_client(engine)
    ok = [
        client.post("/v1/completions", json={"prompt": SHARED + "one", "max_tokens": 4}),
        client.post("/v1/completions", json={"prompt": SHARED + "two", "max_tokens": 4, "stream": True}),
        client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        ),
        client.post("/v1/embeddings", json={"input": [SHARED, "a second text"]}),
        client.get("/v1/engine"),
        client.get("/v1/eviction/stats"),
        client.get("/v1/eviction/policies"),
        client.put("/v1/eviction/policy", json={"policy": "arc"}),
        client.get("/v1/eviction/token"),
        client.put("/v1/eviction/token", json={"policy": "sliding"}),
        client.get("/v1/eviction/logs", params={"tail": 5}),
        client.get("/v1/cache/tree"),
        client.get("/v1/cache/usage"),
        client.post("/v1/cache/reset"),
        client.get("/metrics"),
        client.post("/v1/completions", json={"prompt": SHARED + "three", "max_tokens": 4, "seed": 3}),
    ]
    for answer in ok:
        assert answer.status_code == 200, (answer.request.url, answer.text)
    client.close()


@pytest.mark.slow
def test_every_torch_call_of_a_serving_engine_runs_on_the_engine_thread(tmp_path: Path) -> None:
    calls = TorchCalls()
    with calls.watch():
        engine = Engine(_config(tmp_path))  # loads and warms up the model
        monitor = ThreadsOfMonitor(engine.token_manager.monitor)
        engine.token_manager.monitor = monitor
        engine.start()
        try:
            _serve_everything(engine)
        finally:
            engine.shutdown(drain=True, timeout=30)
    owner = engine.engine_thread.ident
    assert owner is not None and owner != threading.main_thread().ident
    assert set(calls.by_thread) == {owner}, calls.summary()
    seen = set(calls.by_thread[owner])
    # what each stage calls: the thread count, the pool's zeros, an embedding's pooling, the step
    assert {"set_num_threads", "get_num_threads", "_VariableFunctionsClass.zeros"} <= seen, seen
    assert monitor.idents == {owner}


def test_the_engine_thread_runs_jobs_in_order_and_raises_their_errors() -> None:
    worker = EngineThread("sage-engine-job-test")
    assert worker.call(threading.get_ident) == worker.ident != threading.get_ident()
    assert worker.call(threading.current_thread).name == "sage-engine-job-test"
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    order: list[int] = []

    def long_job() -> None:  # as the engine loop does: it runs the jobs queued meanwhile
        later = worker.submit(order.append, 2)
        worker.run_pending()
        order.append(3)
        assert later.done()

    worker.call(long_job)
    assert order == [2, 3]
    worker.close()
    worker.thread.join(5)
    assert not worker.thread.is_alive()


def test_an_unreferenced_engine_thread_ends() -> None:
    worker = EngineThread("sage-engine-gc-test")
    thread, ref = worker.thread, weakref.ref(worker)
    del worker
    gc.collect()
    assert ref() is None
    thread.join(5)
    assert not thread.is_alive()


# ---- --threads -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "0", "two", 1.5])
def test_threads_must_be_a_positive_integer(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError, match="threads"):
        _config(tmp_path, threads=bad)


def test_threads_default_to_none_and_read_strings(tmp_path: Path) -> None:
    assert _config(tmp_path).threads is None
    assert _config(tmp_path, threads="3").threads == 3
    assert EngineConfig.from_dict({"threads": 2}).threads == 2


@contextmanager
def _torch_threads_restored() -> Iterator[None]:
    """`torch.set_num_threads` on any thread changes the process's default for new threads (and
    MKL's): put this thread's back for the tests that follow."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _threads_info(tmp_path: Path, **overrides: Any) -> tuple[Engine, dict[str, Any]]:
    engine = Engine(_config(tmp_path, **overrides))
    return engine, engine.info()["threads"]


def test_threads_are_set_on_the_engine_thread_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with _torch_threads_restored():
        engine, threads = _threads_info(tmp_path, threads=1)
        assert engine.engine_thread.call(torch.get_num_threads) == 1
        cores = usable_cores()
        assert threads == {
            "threads": 1,
            "cores": cores,
            "omp_num_threads": None,
            "torch_threads": 1,
            "warnings": [],
        }
        _, default = _threads_info(tmp_path / "d")
        assert default["threads"] == default["torch_threads"] == cores and default["warnings"] == []


def test_a_disagreeing_omp_num_threads_is_warned_and_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with _torch_threads_restored():
        engine, threads = _threads_info(tmp_path, threads=1)
    assert threads["torch_threads"] == 1 and threads["omp_num_threads"] == "7"
    (warning,) = threads["warnings"]
    assert "OMP_NUM_THREADS=7" in warning and "1 torch threads" in warning
    status = render_status(engine.info())
    assert "  Threads:         1 (" in status and "warning: OMP_NUM_THREADS=7" in status


def test_more_threads_than_cores_is_allowed_and_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = usable_cores()
    with _torch_threads_restored():
        _, threads = _threads_info(tmp_path, threads=cores + 1)
    assert threads["torch_threads"] == cores + 1
    assert threads["warnings"] == [
        f"--threads {cores + 1} is more than the {cores} cores this process may use: they will contend"
    ]


def test_torch_changed_behind_the_engine_is_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with _torch_threads_restored():
        engine, threads = _threads_info(tmp_path, threads=1)
        assert threads["warnings"] == []
        set_threads: Callable[[int], None] = torch.set_num_threads
        engine.engine_thread.call(set_threads, 2)  # as a library might, after the load
        later = engine.info()["threads"]
    assert later["torch_threads"] == 2
    assert later["warnings"] == ["torch runs 2 threads on the engine thread, not the 1 asked for"]
