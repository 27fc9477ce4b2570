"""The engine facade with the real model, pool, cache manager and scheduler (no server).

The central property (docs/architecture.md, "Engine"): greedy outputs with a pool small enough
to force evictions and preemptions equal the outputs with an unbounded pool, for several policies.
"""

from __future__ import annotations

import threading
import time

import pytest
from engine_fixtures import started_engine

from engine_adapter.cache.request import CacheRequest
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.errors import EngineClosedError, RequestError
from sage_eviction import OfflinePolicyError
from sage_eviction.preemption import get_order

pytestmark = pytest.mark.slow  # real processes or long searches: out of the quick loop

SYSTEM = "You are a careful assistant. "
PROMPTS = [
    SYSTEM + "Tell me about caches.",
    SYSTEM + "Tell me about queues.",
    SYSTEM + "Tell me about caches, again.",
    "A different prefix entirely: " + "x" * 11,
    SYSTEM + "Tell me about caches.",  # an exact repeat: served from the prefix cache
    "Short.",
]


def _run_all(engine: Engine, prompts: list[str], max_tokens: int = 24) -> list[list[int]]:
    handles = [engine.submit(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    return [h.result(timeout=120).token_ids for h in handles]


@pytest.fixture(scope="module")
def reference_outputs(tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    engine = started_engine()
    try:
        outputs = _run_all(engine, PROMPTS)
        stats = engine.eviction_stats()
        assert stats.total_evictions == 0
        assert stats.preemptions == 0
    finally:
        engine.shutdown()
    return outputs


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "priority", "lfu", "sieve", "gdsf"])
def test_greedy_outputs_equal_unbounded_pool_under_eviction_and_preemption(
    tmp_path: object, reference_outputs: list[list[int]], policy: str
) -> None:
    # 24 blocks of 4 tokens cannot hold six ~15-block sequences at once: the scheduler must
    # evict cached blocks and preempt running sequences, then recompute them.
    engine = started_engine(num_blocks=24, eviction_policy=policy)
    try:
        outputs = _run_all(engine, PROMPTS)
        stats = engine.eviction_stats()
        engine.cache.check_invariants()
    finally:
        engine.shutdown()
    assert outputs == reference_outputs
    assert stats.total_evictions > 0
    assert stats.preemptions > 0


@pytest.mark.parametrize("order", ["lru", "filo"])
def test_the_engine_preempts_in_the_order_it_was_started_with(
    reference_outputs: list[list[int]], order: str
) -> None:
    """``--preemption-order``: the scheduler hands the cache manager that order (not the policy's
    default), preempts by it, and greedy outputs stay those of an unbounded pool."""
    engine = started_engine(num_blocks=24, eviction_policy="mru", preemption_order=order)
    try:
        assert engine.cache.preemption_order is get_order(order)
        outputs = _run_all(engine, PROMPTS)
        stats = engine.eviction_stats()
    finally:
        engine.shutdown()
    assert outputs == reference_outputs
    assert stats.preemptions > 0


def test_repeated_prompt_is_served_from_the_prefix_cache(tmp_path: object) -> None:
    engine = started_engine()
    try:
        first = engine.submit(PROMPTS[0], SamplingParams(max_tokens=4)).result(60)
        second = engine.submit(PROMPTS[0], SamplingParams(max_tokens=4)).result(60)
    finally:
        engine.shutdown()
    assert first.cached_tokens == 0
    # All full blocks but the one holding the last prompt token (its logits must be computed).
    assert second.cached_tokens == (first.prompt_tokens - 1) // 4 * 4
    assert second.token_ids == first.token_ids


def test_hot_swap_under_load_loses_no_request_and_no_block(tmp_path: object) -> None:
    engine = started_engine(num_blocks=48)
    stop = threading.Event()
    swaps: list[dict[str, object]] = []
    errors: list[BaseException] = []

    def swapper() -> None:
        names = ["arc", "s3fifo", "lfu", "slru:protected_threshold=2", "lru"]
        i = 0
        try:
            while not stop.is_set():
                with engine.cache.lock:  # between two steps, as the server's swap is
                    keys_before = {b.key for b in engine.cache.radix.blocks()}
                    answer = engine.set_policy(names[i % len(names)], {})
                    keys_after = {b.key for b in engine.cache.radix.blocks()}
                    engine.cache.check_invariants()
                assert answer["entries"] == len(keys_before)
                assert keys_after == keys_before
                swaps.append(answer)
                i += 1
                stop.wait(0.01)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=swapper)
    thread.start()
    try:
        outputs = [engine.submit(p * 2, SamplingParams(max_tokens=12)) for p in PROMPTS * 3]
        results = [h.result(timeout=120) for h in outputs]
    finally:
        stop.set()
        thread.join()
        engine.shutdown()
    assert not errors, errors
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert len(swaps) >= 2


def test_swap_keeps_every_cached_block(tmp_path: object) -> None:
    engine = started_engine(num_blocks=64)
    try:
        _run_all(engine, PROMPTS, max_tokens=4)
        keys_before = {b.key for b in engine.cache.radix.blocks()}
        answer = engine.set_policy("arc", {})
        keys_after = {b.key for b in engine.cache.radix.blocks()}
        assert answer["old"]["name"] == "lru" and answer["new"]["name"] == "arc"
        assert answer["entries"] == len(keys_before)
        assert keys_after == keys_before
        engine.cache.check_invariants()
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("prompt", "sampling", "message"),
    [
        ("", {}, "empty"),
        ([], {}, "empty"),
        ([999_999], {}, "vocabulary"),
        ("hello", {"max_tokens": 10_000}, "exceeds the KV pool"),
    ],
)
def test_bad_requests_are_rejected_and_the_engine_keeps_serving(
    tmp_path: object, prompt: str | list[int], sampling: dict[str, int], message: str
) -> None:
    engine = started_engine(num_blocks=64)
    try:
        with pytest.raises(RequestError, match=message):
            engine.submit(prompt, SamplingParams(**sampling))
        out = engine.submit("still serving", SamplingParams(max_tokens=3)).result(60)
        assert out.completion_tokens == 3
    finally:
        engine.shutdown()


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"max_tokens": 0}, {"top_k": -5}])
def test_bad_sampling_values_name_the_value(bad: dict[str, float]) -> None:
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_stop_string_ends_the_output_without_it(tmp_path: object) -> None:
    engine = started_engine()
    try:
        free = engine.submit("abc", SamplingParams(max_tokens=30, ignore_eos=True)).result(60)
        text = free.text
        # Stop at the first non-empty piece of the free-running output.
        needle = next((text[i : i + 2] for i in range(3, len(text) - 2) if text[i : i + 2].strip()), None)
        if needle is None:
            pytest.skip("the random model produced no printable text to stop on")
        stopped = engine.submit("abc", SamplingParams(max_tokens=30, ignore_eos=True, stop=[needle])).result(
            60
        )
    finally:
        engine.shutdown()
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.find(needle)]


def test_queue_limit_drops_the_lowest_priority(tmp_path: object) -> None:
    engine = started_engine(max_queued_requests=2, max_num_seqs=1)
    try:
        engine.draining = False
        with engine.cache.lock:  # hold the loop so that all four wait together
            handles = [
                engine.submit(f"request {i}", SamplingParams(max_tokens=2), priority=p)
                for i, p in enumerate([1, 0, 2, 1])
            ]
            engine._drain_inbox()
        results = [h.result(60) for h in handles]
    finally:
        engine.shutdown()
    dropped = [r for r in results if r.finish_reason == "dropped"]
    assert len(dropped) == 2
    assert all("queue full" in (r.error or "") for r in dropped)
    assert results[1].finish_reason == "dropped"  # the only priority-0 request


def test_queued_timeout_aborts_with_a_reason(tmp_path: object) -> None:
    engine = started_engine(queued_timeout=0.001, max_num_seqs=1)
    try:
        with engine.cache.lock:
            handles = [engine.submit(f"wait {i}", SamplingParams(max_tokens=2)) for i in range(3)]
            engine._drain_inbox()
            time.sleep(0.01)
        results = [h.result(60) for h in handles]
    finally:
        engine.shutdown()
    timed_out = [r for r in results if r.finish_reason == "timeout"]
    assert timed_out
    assert all("queued_timeout" in (r.error or "") for r in timed_out)


def test_drain_finishes_requests_then_refuses_new_ones(tmp_path: object) -> None:
    engine = started_engine()
    handles = [engine.submit(p, SamplingParams(max_tokens=6)) for p in PROMPTS]
    engine.shutdown(drain=True, timeout=120)
    assert all(h.finished and h.result().finish_reason == "length" for h in handles)
    with pytest.raises(EngineClosedError):
        engine.submit("late", SamplingParams())


def test_offline_policy_is_refused(tmp_path: object) -> None:
    with pytest.raises(OfflinePolicyError, match="needs the future"):
        Engine(
            EngineConfig(device="cpu", num_blocks=16, eviction_policy="belady", socket="/tmp/x-unused.sock")
        )


def test_lifetime_prediction_feeds_the_predictive_policy(tmp_path: object) -> None:
    engine = started_engine(eviction_policy="predictive", enable_lifetime_prediction=True)
    try:
        first = engine.submit(PROMPTS[0], SamplingParams(max_tokens=8, ignore_eos=True)).result(60)
        learnt = engine.hooks.tpot_estimate_s
        with engine.cache.lock:  # hold the loop: the request is admitted, not yet finished
            handle = engine.submit(PROMPTS[1], SamplingParams(max_tokens=8, ignore_eos=True))
            engine._drain_inbox()
            engine.scheduler._admit()
            (seq,) = engine.scheduler.running
            state = engine.cache.sequence(seq.seq_id)
            candidates = engine.cache.preemption_candidates()
        handle.result(60)
    finally:
        engine.shutdown()
    assert first.completion_tokens == 8
    assert learnt != 0.02  # learnt from the first request's token times
    assert state.request.estimated_lifetime == pytest.approx(8 * learnt)
    assert candidates[0].estimated_lifetime == pytest.approx(8 * learnt)


def test_without_lifetime_prediction_no_lifetime_is_given(tmp_path: object) -> None:
    engine = started_engine(eviction_policy="predictive")
    try:
        with engine.cache.lock:
            handle = engine.submit(PROMPTS[1], SamplingParams(max_tokens=4))
            engine._drain_inbox()
            engine.scheduler._admit()
            (seq,) = engine.scheduler.running
            lifetime = engine.cache.sequence(seq.seq_id).request.estimated_lifetime
        handle.result(60)
    finally:
        engine.shutdown()
    assert lifetime is None


def test_the_engine_seed_makes_unseeded_sampling_reproducible(tmp_path: object) -> None:
    outputs = []
    for _ in range(2):
        engine = started_engine(seed=7)
        try:
            params = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
            outputs.append([engine.submit("sample me", params).result(60).token_ids for _ in range(2)])
        finally:
            engine.shutdown()
    assert outputs[0] == outputs[1]
    assert outputs[0][0] != outputs[0][1]  # each request draws its own stream


def test_a_failed_step_logs_its_traceback_with_the_request_ids_and_the_engine_serves_on(
    tmp_path: object,
) -> None:
    from structlog.testing import capture_logs

    engine = started_engine()
    real_step = engine.scheduler.step
    calls = {"n": 0}

    def failing_once() -> object:
        # The second step: the first has admitted and prefilled the request, so it is running.
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in the step")
        return real_step()

    engine.scheduler.step = failing_once  # type: ignore[method-assign]
    try:
        with capture_logs() as logs:
            failed = engine.submit("Short.", SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=60)
        served = engine.submit("Short.", SamplingParams(max_tokens=4, ignore_eos=True)).result(timeout=60)
    finally:
        engine.shutdown()
    assert failed.finish_reason == "error" and "RuntimeError: a bug in the step" in (failed.error or "")
    [entry] = [e for e in logs if e["event"] == "engine step failed"]
    assert entry["log_level"] == "error"
    assert failed.request_id in entry["request_ids"]
    assert isinstance(entry["exc_info"], RuntimeError)
    assert served.finish_reason == "length" and served.completion_tokens == 4


def test_a_request_whose_admission_fails_ends_alone_and_the_queue_moves_on(tmp_path: object) -> None:
    from structlog.testing import capture_logs

    engine = started_engine()
    real_allocate = engine.cache.allocate

    def allocate(request: CacheRequest) -> object:
        if request.cache_salt == "poison":
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return real_allocate(request)

    engine.cache.allocate = allocate  # type: ignore[method-assign]
    try:
        with capture_logs() as logs:
            poison = engine.submit("Short.", SamplingParams(max_tokens=4), cache_salt="poison")
            others = [engine.submit(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in PROMPTS[:3]]
            failed = poison.result(timeout=60)
            served = [h.result(timeout=120) for h in others]
    finally:
        engine.shutdown()
    assert failed.finish_reason == "error" and "UnicodeEncodeError" in (failed.error or "")
    assert all(s.finish_reason == "length" and s.completion_tokens == 4 for s in served)
    [entry] = [e for e in logs if e["event"] == "admission failed"]
    assert entry["request_id"] == failed.request_id and isinstance(entry["exc_info"], UnicodeEncodeError)


def test_final_output_holds_every_generated_token(tmp_path: object) -> None:
    """The token that ends a request (here its max_tokens-th) is in the final token_ids and in
    the deltas, as completion_tokens counts it."""
    engine = started_engine()
    try:
        handle = engine.submit(PROMPTS[0], SamplingParams(max_tokens=7, ignore_eos=True))
        result = handle.result(60)
        streamed = [t for delta in handle for t in delta.token_ids]
        text = engine.tokenizer.decode(result.token_ids)
    finally:
        engine.shutdown()
    assert result.finish_reason == "length"
    assert len(result.token_ids) == result.completion_tokens == 7
    assert streamed == result.token_ids
    assert text == result.text
