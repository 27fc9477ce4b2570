"""The batch limit reacts to eviction (the module spec's SchedulerOptimizer.adjust_batch_size).

- `AdaptiveBatch` against the spec's rule, over hypothesis-generated windows of eviction and
  re-prefill counts: halve (floor 1) when re-prefilled / evicted blocks in the window pass 0.3,
  double (up to the configured ceiling) when fewer than 10 blocks were evicted, else keep; a
  decision only at the end of each window; every change recorded.
- The simulator with `adaptive_batch=True` on a generated workload under memory pressure: the
  limit changes, every change follows the rule, and the figures are the golden ones (fewer
  preemptions here; see the table of docs/concepts/observability.md for the effect on the Mooncake traces).
- `sage llm benchmark --adaptive-batch` prints each policy without and with it side by side,
  and refuses the flat cache model and engine mode in one line.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_process import benchmark
from hypothesis import given
from hypothesis import strategies as st

from engine_adapter.cache.adaptive_batch import AdaptiveBatch
from engine_adapter.sim.benchmark import build_workload
from engine_adapter.sim.simulator import Simulator


@given(
    ceiling=st.integers(1, 300),
    window=st.integers(1, 5),
    steps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=60),
)
def test_the_spec_rule_over_windows(ceiling: int, window: int, steps: list[tuple[int, int]]) -> None:
    adaptive = AdaptiveBatch(ceiling, window=window)
    evicted_total = re_total = 0
    window_evicted = window_re = 0
    for i, (evicted, re_prefilled) in enumerate(steps, start=1):
        re_prefilled = min(re_prefilled, evicted + window_evicted)  # cannot exceed what left
        evicted_total += evicted
        re_total += re_prefilled
        window_evicted += evicted
        window_re += re_prefilled
        before = adaptive.current
        change = adaptive.observe(evicted_total, re_total)
        if i % window:
            assert change is None and adaptive.current == before
            continue
        rate = window_re / window_evicted if window_evicted else 0.0
        if rate > 0.3:
            expected = max(1, before // 2)
        elif window_evicted < 10:
            expected = min(ceiling, before * 2)
        else:
            expected = before
        assert adaptive.current == expected
        assert (change is not None) == (expected != before)
        if change is not None:
            assert (change.old, change.new, change.evictions) == (before, expected, window_evicted)
            assert change.reason == ("re-prefill" if expected < before else "rare-evictions")
        window_evicted = window_re = 0
        assert 1 <= adaptive.current <= ceiling
    assert len(adaptive.changes) == adaptive.shrinks + adaptive.grows


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError):
        AdaptiveBatch(0)
    with pytest.raises(ValueError):
        AdaptiveBatch(8, threshold=1.5)
    with pytest.raises(ValueError):
        AdaptiveBatch(8, window=0)


def test_simulator_golden_under_memory_pressure() -> None:
    workload = build_workload(workload="synthetic", requests=300, seed=0)
    fixed = Simulator(workload, "lru", 452).run()
    adaptive_sim = Simulator(workload, "lru", 452, adaptive_batch=True)
    adaptive = adaptive_sim.run()
    assert (fixed.adaptive_batch, fixed.batch_changes) == (False, 0)
    assert adaptive.adaptive_batch and adaptive.batch_changes == 211
    assert (fixed.preemptions, adaptive.preemptions) == (37, 29)
    assert adaptive.hit_rate == pytest.approx(fixed.hit_rate, abs=0.02)
    assert adaptive_sim.adaptive is not None
    for change in adaptive_sim.adaptive.changes:
        if change.new < change.old:
            assert change.re_prefill_rate > 0.3 and change.new == max(1, change.old // 2)
        else:
            assert change.evictions < 10 and change.new == min(256, change.old * 2)
    with pytest.raises(ValueError, match="radix"):
        Simulator(workload, "lru", 452, cache_model="flat", adaptive_batch=True)


def _sage(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return benchmark(*args, home=tmp)


@pytest.mark.slow
def test_benchmark_shows_with_and_without(tmp_path: Path) -> None:
    proc = _sage(
        "--workload", "synthetic", "--requests", "150", "--eviction-policies", "lru",
        "--capacity-blocks", "452", "--adaptive-batch", tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the table's rows: a policy, then its capacity (the footer may wrap to a line starting "lru")
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith("lru")]
    assert [row[2] for row in rows if row[1].isdigit()] == ["no", "yes"]
    assert "TTFT p99 s" in proc.stdout and "Tok/s" in proc.stdout and "Re-prefill" in proc.stdout
    for args in (("--cache-model", "flat"), ("--mode", "engine")):
        bad = _sage("--adaptive-batch", *args, tmp=tmp_path)
        assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_engine_scheduler_follows_the_limit_and_keeps_greedy_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's scheduler with --adaptive-batch (a 1-step window, so it moves often in a
    short run): no request is admitted while the running ones reach the limit, each change is
    exported, and greedy outputs equal those of the same engine without it."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from engine_adapter.model.sampling import SamplingParams
    from engine_adapter.serving.config import EngineConfig
    from engine_adapter.serving.engine import Engine

    prompts = [f"System prompt {i % 2}: be brief. Tell me about caches number {i}." for i in range(8)]
    config = dict(
        device="cpu", block_size=4, num_blocks=24, name="adaptive", socket="/tmp/sage-unused.sock",
        max_num_batched_tokens=64, max_num_seqs=8,
    )  # fmt: skip

    def run(engine: Engine) -> list[list[int]]:
        handles = [engine.submit(p, SamplingParams(max_tokens=16, ignore_eos=True)) for p in prompts]
        return [h.result(timeout=120).token_ids for h in handles]

    plain = Engine(EngineConfig(**config))  # type: ignore[arg-type]
    plain.start()
    try:
        reference = run(plain)
    finally:
        plain.shutdown()

    # The engine builds its AdaptiveBatch with the default window: here, one of a step.
    monkeypatch.setattr(
        "engine_adapter.serving.engine.AdaptiveBatch", lambda max_batch: AdaptiveBatch(max_batch, window=1)
    )
    engine = Engine(EngineConfig(**config, adaptive_batch=True))  # type: ignore[arg-type]
    adaptive = engine.scheduler.adaptive
    assert adaptive is not None and adaptive.ceiling == 8 and adaptive.window == 1
    steps: list[tuple[int, int, int]] = []  # running before, limit before, admitted
    step = engine.scheduler.step

    def recorded() -> object:
        running, limit = len(engine.scheduler.running), adaptive.current
        stats = step()
        steps.append((running, limit, stats.admitted))
        return stats

    engine.scheduler.step = recorded  # type: ignore[method-assign]
    engine.start()
    try:
        outputs = run(engine)
        text = generate_latest(engine.metrics_registry()).decode()
    finally:
        engine.shutdown()
    assert outputs == reference
    assert adaptive.shrinks > 0 and adaptive.grows > 0
    assert all(admitted == 0 for running, limit, admitted in steps if running >= limit)
    assert all(running + admitted <= max(limit, running) for running, limit, admitted in steps)
    samples = {
        (s.name, s.labels.get("direction")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("sage:batch_changes_total", "shrink")] == adaptive.shrinks
    assert samples[("sage:batch_changes_total", "grow")] == adaptive.grows
    assert samples[("sage:max_running_batch", None)] == adaptive.current
