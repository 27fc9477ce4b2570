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
