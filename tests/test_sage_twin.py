"""The `sage` cache model (engine_adapter/sim/twins/sage_*.py) held to sage's own engine.

Interleaved multi-turn chats over a shared system prompt go through a real sage-tiny engine
(tests/engine_fixtures.py: greedy, ``ignore_eos`` and a fixed ``max_tokens``, so every answer has
the same length) one request at a time and then all at once, and the twin replays the same
requests with the engine's settings (block size, pool, policy, ``max_num_seqs``,
``max_num_batched_tokens``, admission by priority then age, chunked prefill): every request's
cached tokens and the preemption count must be the engine's, for lru, lfu, s3fifo and arc, in a
pool small enough to evict and to preempt.

"All at once" is made deterministic on the engine's side: the requests are submitted while the
test holds the cache manager's lock, which the engine's loop takes before it drains its inbox, so
all are queued before its first step (arrival order = submission order), as the twin queues them
at time 0. Submitted over HTTP one by one, how many arrive before the first step is timing, which
no simulator can replay.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_process import benchmark
from engine_fixtures import serving
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.engine import Engine
from engine_adapter.sim.twins import TWINS, twin_runner
from engine_adapter.sim.twins.chats import ChatScript, chat_script, stand_in_answers, token_workload
from engine_adapter.sim.twins.sage_run import make_cache, simulate_sage
from engine_adapter.sim.twins.sage_sched import SageSchedulerConfig, SageSequence, SageTwin
from engine_adapter.sim.twins.vllm_fidelity import ONE_AT_A_TIME_GAP_S
from engine_adapter.sim.workloads import SimRequest, Workload

BLOCK_SIZE = 4
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 64  # a 100-token prompt prefills in chunks
OUTPUT_LEN = 6
# sage-tiny's vocabulary is 264 tokens; 24 chats turns, prompts up to 100 tokens (25 blocks)
SCRIPT: dict[str, Any] = {
    "requests": 24, "chats": 4, "system_tokens": 24, "message_tokens": (4, 12),
    "max_prompt_tokens": 100, "output_len": OUTPUT_LEN, "seed": 3, "token_range": (4, 260),
}  # fmt: skip
POOL = 45  # against ~150 distinct blocks: evicts; all at once, 8 running sequences preempt


def priority_of(i: int) -> int:
    """Request i's priority: mixed, so that admission by priority then age is not arrival order."""
    return (0, 2, 1)[i % 3]


@dataclass(frozen=True, slots=True)
class EngineRun:
    prompts: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]]
    cached_tokens: list[int]
    preemptions: int


def _engine(policy: str, pool: int) -> AbstractContextManager[Engine]:
    return serving(
        num_blocks=pool,
        block_size=BLOCK_SIZE,
        eviction_policy=policy,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )


_SAMPLING = SamplingParams(max_tokens=OUTPUT_LEN, ignore_eos=True)  # greedy


def one_at_a_time(script: ChatScript, policy: str, pool: int) -> EngineRun:
    """Each turn sent when the one before has its answer; its prompt holds the earlier answers."""
    n = len(script.turns)
    answers: list[tuple[int, ...]] = []
    prompts, cached = [], []
    with _engine(policy, pool) as engine:
        for i in range(n):
            prompt = script.prompts([*answers, *[()] * (n - i)])[i]  # turn i reads answers < i only
            out = engine.submit(list(prompt), _SAMPLING, priority=priority_of(i)).result(120)
            prompts.append(prompt)
            answers.append(tuple(out.token_ids))
            cached.append(out.cached_tokens)
        preemptions = engine.scheduler.total_preemptions
    return EngineRun(prompts, answers, cached, preemptions)


def all_at_once(prompts: Sequence[tuple[int, ...]], policy: str, pool: int) -> EngineRun:
    """Every prompt queued before the engine's first step (module docstring)."""
    with _engine(policy, pool) as engine:
        with engine.cache.lock:
            handles = [
                engine.submit(list(p), _SAMPLING, priority=priority_of(i)) for i, p in enumerate(prompts)
            ]
        outs = [h.result(120) for h in handles]
        preemptions = engine.scheduler.total_preemptions
    return EngineRun(
        list(prompts), [tuple(o.token_ids) for o in outs], [o.cached_tokens for o in outs], preemptions
    )


def twin_workload(script: ChatScript, run: EngineRun, gap_s: float) -> Workload:
    """The engine run's requests (prompts, answers, priorities) as the simulator's workload."""
    workload = token_workload(script, run.prompts, run.outputs, block_size=BLOCK_SIZE, gap_s=gap_s)
    requests = [dataclasses.replace(r, priority=priority_of(i)) for i, r in enumerate(workload.requests)]
    return dataclasses.replace(workload, requests=requests)


def check_twin(
    script: ChatScript, run: EngineRun, policy: str, pool: int, gap_s: float, **options: Any
) -> None:
    """The twin with the engine's settings (`options`: the twin's own) hits as `run` did."""
    twin = simulate_sage(
        twin_workload(script, run, gap_s),
        policy,
        pool,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        **options,
    )
    where = f"{policy}, {pool} blocks, {'one at a time' if gap_s else 'all at once'}"
    assert sum(run.cached_tokens) > 0, (
        f"{where}: the engine hit nothing; the workload does not exercise the cache"
    )
    differing = [i for i, (a, b) in enumerate(zip(run.cached_tokens, twin.hit_tokens, strict=True)) if a != b]
    assert differing == [], f"{where}: requests {differing} differ: {run.cached_tokens} vs {twin.hit_tokens}"
    assert twin.preemptions == run.preemptions, where
    assert twin.result.evictions > 0, f"{where}: nothing was evicted; the pool is too large to test eviction"


def _engine_case(policy: str) -> None:
    script = chat_script(**SCRIPT)
    one = one_at_a_time(script, policy, POOL)
    check_twin(script, one, policy, POOL, ONE_AT_A_TIME_GAP_S)
    every = all_at_once(one.prompts, policy, POOL)
    assert every.preemptions > 0, f"{policy}: all at once preempted nothing; the pool is too large"
    check_twin(script, every, policy, POOL, 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lru", "lfu", "s3fifo", "arc"])
def test_the_twin_hits_and_preempts_as_the_engine_request_by_request(policy: str) -> None:
    _engine_case(policy)


# ---- the twin's options, without an engine -------------------------------------------------


def _request(i: int, prompt: Sequence[int], output_len: int = 2, priority: int = 0) -> SimRequest:
    tokens = (*prompt, *[7] * output_len)
    return SimRequest(i, 0.0, (), len(prompt), output_len, priority=priority, token_ids=tokens)


def _hits(requests: list[SimRequest], **options: Any) -> list[int]:
    workload = Workload(requests=requests, block_size=4, source="test")
    return simulate_sage(workload, "lru", 64, max_num_seqs=1, **options).hit_tokens


def test_admission_is_by_priority_then_age_as_in_the_engine() -> None:
    shared = list(range(10, 22))  # 3 blocks
    # r0 runs first (highest priority); r1 (low) and r2 (normal) wait for its slot with the same
    # prompt: the engine admits r2 first, which computes it, and r1 then hits its 2 blocks (the
    # last token is always computed: 8 tokens); first come first served, r1 computes and r2 hits.
    requests = [_request(0, range(40, 48), priority=2), _request(1, shared), _request(2, shared, priority=1)]
    assert _hits(requests) == [0, 8, 0]
    assert _hits(requests, admission="fcfs") == [0, 0, 8]


def test_chunked_prefill_takes_the_steps_the_budget_allows() -> None:
    def steps_to_first_token(chunked: bool) -> int:
        cache = make_cache("lru", 32, 4)
        twin = SageTwin(cache, SageSchedulerConfig(4, 8, chunked_prefill=chunked))
        seq = SageSequence(0, 1, 40, 3, 0, token_ids=list(range(10, 53)))
        twin.add(seq)
        steps = 0
        while seq.num_output == 0:
            twin.step()
            steps += 1
        return steps

    assert steps_to_first_token(True) == 5  # 40 prompt tokens, 8 a step
    assert steps_to_first_token(False) == 1


def test_unknown_admission_and_offline_policies_are_refused() -> None:
    workload = Workload(requests=[_request(0, range(8))], block_size=4, source="test")
    with pytest.raises(ValueError, match="admission 'lifo'; choose one of priority, fcfs"):
        simulate_sage(workload, "lru", 8, admission="lifo")
    with pytest.raises(ValueError, match="needs the future"):
        simulate_sage(workload, "belady", 8)
    with pytest.raises(ValueError, match="request 0: sequence 1 would need 3 blocks but the pool has 2"):
        simulate_sage(workload, "lru", 2)


def test_the_sage_twin_is_registered_for_the_cli() -> None:
    assert TWINS["sage"] == "engine_adapter.sim.twins.sage_run:simulate_sage"
    assert twin_runner("sage") is simulate_sage


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    pool=st.integers(30, 60),
    gap=st.sampled_from([0.0, ONE_AT_A_TIME_GAP_S]),
    policy=st.sampled_from(["lru", "lfu", "s3fifo", "arc"]),
)
def test_every_request_finishes_and_hits_at_most_the_unbounded_row_alone(
    seed: int, pool: int, gap: float, policy: str
) -> None:
    script = chat_script(**{**SCRIPT, "requests": 16, "seed": seed})
    answers = stand_in_answers(script)
    workload = token_workload(script, script.prompts(answers), answers, block_size=BLOCK_SIZE, gap_s=gap)
    run = simulate_sage(
        workload, policy, pool, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS
    )
    unbounded = simulate_sage(
        workload, "unbounded", max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS
    )
    assert run.result.requests == len(workload.requests)
    for r, hit in zip(workload.requests, run.hit_tokens, strict=True):
        assert hit % BLOCK_SIZE == 0 and hit < r.input_len  # whole blocks; the last token is computed
    assert unbounded.preemptions == 0 and unbounded.result.evictions == 0
    if gap:  # one request at a time: a bounded cache holds a subset of what the unbounded one holds
        assert all(h <= u for h, u in zip(run.hit_tokens, unbounded.hit_tokens, strict=True))


@pytest.mark.slow
def test_the_benchmark_runs_the_sage_model_in_a_real_process(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    proc = benchmark("--eviction-policies", "lru,s3fifo", "--cache-model", "sage", "--requests", "120",
                     "--jobs", "1", "--output", str(out), home=tmp_path, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert {r["cache_model"] for r in rows} == {"sage"}
    assert rows[-1]["policy"] == "unbounded" and "belady" not in {r["policy"] for r in rows}
    assert all(0 < r["hit_rate"] <= rows[-1]["hit_rate"] for r in rows)
    assert rows[-1]["evictions"] == 0 and any(r["preemptions"] > 0 for r in rows[:-1])
