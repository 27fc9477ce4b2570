"""`benchmarks/soak.py --unique-prompts` (benchmarks/soak_unique.py): its verdict, and a short
bridge replay as a real process."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _module() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("soak_unique_under_test", BENCHMARKS / "soak_unique.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_verdict_is_the_fitted_slope_after_warm_up() -> None:
    """A leak of 2 MiB per 10,000 requests under noise of +-3 MiB fails; the same noise over a
    flat line, with a warm-up that fills 40 MiB first, passes."""
    judge = _module().judge
    rng = random.Random(0)
    xs = range(1000, 100_001, 1000)
    leaking = [(x, 400 + 2 * x / 10_000 + rng.uniform(-3, 3)) for x in xs]
    flat = [(x, 400 + min(x, 20_000) / 500 + rng.uniform(-3, 3)) for x in xs]
    bad, good = judge(leaking, 100_000, 0.2, 1.0, 10_000), judge(flat, 100_000, 0.2, 1.0, 10_000)
    assert not bad["within"] and bad["slope_mib"] == pytest.approx(2.0, abs=0.5)
    assert good["within"] and abs(good["slope_mib"]) < 0.5
    assert good["samples_fitted"] == 81


def test_a_short_run_ends_its_warm_up_at_the_minimum_and_says_so() -> None:
    """20,000 requests whose RSS fills for the first 10,000 (the event ring and the re-prefill
    window) and is flat after: the share alone (20 %: 4,000) fits the filling and fails; the
    minimum of 10,000 requests ends the warm-up after it and passes, and the verdict names it."""
    module = _module()
    rng = random.Random(0)
    filling = [(x, 400 + min(x, 10_000) / 250 + rng.uniform(-0.3, 0.3)) for x in range(500, 20_001, 500)]
    by_share = module.judge(filling, 20_000, 0.2, 1.0, 10_000)
    by_minimum = module.judge(filling, 20_000, 0.2, 1.0, 10_000, minimum=10_000)
    assert not by_share["within"] and by_share["warm_up_by"] == "share 0.2"
    assert by_share["warm_up_end"] == 4000
    assert by_minimum["within"] and by_minimum["warm_up_by"] == "minimum 10,000"
    assert by_minimum["warm_up_end"] == 10_000 and by_minimum["samples_fitted"] == 21
    long_run = module.judge(filling, 100_000, 0.2, 1.0, 10_000, minimum=10_000)
    assert long_run["warm_up_by"] == "share 0.2" and long_run["warm_up_end"] == 20_000


def test_the_warm_up_waits_for_the_engines_windows_to_fill_and_a_run_they_never_fill_is_not_judged() -> None:
    """A model whose prompts evict few blocks per request fills the event ring late: RSS climbs
    until 6,000 requests (the ring filling) and is flat after. Ended by the share and the minimum
    (2,000) the fit takes in the filling and fails; ended where the engine had evicted a ring's
    worth of blocks it passes and says so; a run that never evicted that much fits nothing."""
    module = _module()
    rng = random.Random(1)
    xs = range(100, 10_001, 100)
    filling = [(x, 1800 + min(x, 6000) / 1000 + rng.uniform(-0.05, 0.05)) for x in xs]
    evictions = [(x, 2 * x if x <= 3000 else 6000 + (x - 3000)) for x in xs]  # slower once the pool is full
    filled_at = module.windows_filled_at(evictions, module.EVENT_RING)
    assert filled_at == 7000
    early = module.judge(filling, 10_000, 0.2, 1.0, 10_000, minimum=2000)
    late = module.judge(filling, 10_000, 0.2, 1.0, 10_000, minimum=2000, filled_at=filled_at)
    assert not early["within"] and early["slope_mib"] > 1.0
    assert late["within"] and late["warm_up_by"] == "windows filled at 7,000" and late["warm_up_end"] == 7000
    assert module.windows_filled_at(evictions[:60], module.EVENT_RING) is None
    short = [(x, y) for x, y in filling if x <= 6000]
    never = module.judge(short, 6000, 0.2, 1.0, 10_000, minimum=2000, filled_at=None)
    assert not never["within"] and never["samples_fitted"] == 0
    assert never["warm_up_by"] == "windows still filling at the end" and never["warm_up_end"] == 6000


def test_long_prompts_are_an_option_and_a_bad_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    module = _module()
    args = module.arguments(["--requests", "100", "--long-share", "0.5", "--long-words", "32,96"])
    assert (args.long_share, args.long_words) == (0.5, (32, 96))
    prompts = module.Prompts(random.Random(0), long_share=1.0, long_words=(32, 96))
    words = [len(prompts.next()[0].split(": ", 1)[1].split()) for _ in range(200)]
    assert min(words) >= 32 and max(words) <= 96  # sessions' later turns aside, every prompt is long
    for bad in (["--long-words", "9,3"], ["--long-words", "x"], ["--long-share", "1.5"]):
        with pytest.raises(SystemExit) as exit_:
            module.arguments(["--requests", "100", *bad])
        assert exit_.value.code == 2
    assert "LO,HI" in capsys.readouterr().err


def test_the_warm_up_minimum_defaults_to_10000_requests_for_the_engine_and_0_keys_for_a_bridge() -> None:
    arguments = _module().arguments
    assert arguments(["--requests", "2000"]).warm_up_min == 10_000
    assert arguments(["--target", "lmcache", "--keys", "1000"]).warm_up_min == 0
    assert arguments(["--requests", "2000", "--warm-up-min", "500"]).warm_up_min == 500


@pytest.mark.slow  # 200,000 keys through a bridge in a new process
def test_a_bridge_replay_holds_its_window_of_evicted_keys() -> None:
    done = subprocess.run(
        [
            sys.executable, str(BENCHMARKS / "soak.py"), "--unique-prompts", "--target", "lmcache",
            "--keys", "200000", "--bridge-capacity", "256", "--json",
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert report["evicted"] == 200_000 - 256
    assert report["evicted_keys_held"] == report["evicted_keys_window"] == 8192
    assert len(report["samples"]) == 100 and "cores" in report["machine"]
