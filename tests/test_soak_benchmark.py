"""`benchmarks/soak.py` as a real process: a few seconds of mixed load on a sage-tiny engine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a real engine process and several seconds of load

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"


def test_a_short_soak_serves_every_good_request_and_refuses_every_malformed_one() -> None:
    done = subprocess.run(
        [
            sys.executable, str(SOAK), "--duration", "5", "--clients", "4", "--model", "sage-tiny",
            "--admin-interval", "1", "--sample-interval", "1", "--json",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert report["passed"] and report["failed"] == []
    assert "cores" in report["machine"]

    good, malformed = report["groups"]["good"], report["groups"]["malformed"]
    assert good["as_expected"] == good["sent"] > 0
    assert malformed["as_expected"] == malformed["sent"] > 0
    kinds = report["kinds"]
    for name, kind in kinds.items():
        statuses = {int(code) for code in kind["statuses"]}  # a timeout or lost answer is not a code
        if kind["group"] == "malformed":
            assert all(400 <= code < 500 for code in statuses), (name, kind)
        else:
            assert statuses == {200}, (name, kind)
        assert kind["failures"] == {}, (name, kind)
    assert {"completion", "completion_stream", "health"} <= set(kinds)
    assert "swap" in kinds or "reset" in kinds  # client 0's admin calls every second

    determinism = report["determinism"]
    assert determinism["requests_checked"] > 0 and determinism["mismatches"] == 0
    engine = report["engine"]
    assert engine["healthy_at_end"] and engine["exit_code"] == 0
    assert engine["start"]["rss_kib"] > 0 and engine["end"]["fds"] > 0
    assert len(engine["samples"]) >= 3  # start, one a second under load, end
    drift = engine["drift"]
    assert drift["rss_within"] and drift["fds_within"], drift
    assert drift["limits"] == {"max_rss_growth_mib": 32.0, "max_fd_growth": 2, "warm_up_share": 0.2}


# --------------------------------------------------------------------------------------------
# The drift guard: a leaking process fails the soak, a flat one passes (the soak module's own
# Sampler, drift and verdict, on real processes)


def _soak_module() -> Any:
    sys.path.insert(0, str(SOAK.parent))
    try:
        spec = importlib.util.spec_from_file_location("soak_under_test", SOAK)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SOAK.parent))


LEAKER = """
import sys, time
leak_fds, leak_kib = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(40):
    for _ in range(leak_fds):
        held.append(open("/dev/null"))
    held.append(bytearray(leak_kib * 1024))
    time.sleep(0.05)
time.sleep(5)
"""


def _sampled_drift(soak: Any, leak_fds: int, leak_kib: int) -> dict[str, Any]:
    """Run a child that leaks `leak_fds` descriptors and `leak_kib` KiB per tick for 2 s,
    sample it with the soak's own Sampler, and judge the drift with the default limits."""
    child = subprocess.Popen([sys.executable, "-c", LEAKER, str(leak_fds), str(leak_kib)])
    try:
        time.sleep(0.3)
        sampler = soak.Sampler(child, 0.1, time.monotonic())
        first = sampler.sample()
        sampler.start()
        time.sleep(2.2)
        sampler.stop.set()
        sampler.join()
        last = sampler.sample()
        return soak.drift(sampler.samples, first, last, soak.DriftLimits())
    finally:
        child.kill()
        child.wait()


def test_a_process_that_leaks_fails_the_drift_guard_and_a_flat_one_passes() -> None:
    soak = _soak_module()
    leaking = _sampled_drift(soak, leak_fds=1, leak_kib=2048)  # 40 descriptors, 80 MiB in 2 s
    assert leaking["fd_growth"] >= 30 and leaking["rss_growth_mib"] > 32, leaking
    reasons = soak.drift_reasons(leaking)
    assert any("RSS grew" in r and "limit 32 MiB" in r for r in reasons), reasons
    assert any("more open file descriptors" in r and "limit 2" in r for r in reasons), reasons

    flat = _sampled_drift(soak, leak_fds=0, leak_kib=0)
    assert flat["rss_within"] and flat["fds_within"], flat
    assert soak.drift_reasons(flat) == []


def test_the_verdict_fails_on_drift() -> None:
    soak = _soak_module()
    samples = [{"t_s": float(t), "rss_kib": 400_000.0 + 1000.0 * t, "fds": 13.0} for t in range(101)]
    judged = soak.drift(samples, {"fds": 13.0}, {"fds": 20.0}, soak.DriftLimits())
    report = {
        "groups": {"good": {"sent": 1, "as_expected": 1}},
        "kinds": {},
        "determinism": {"mismatches": 0},
        "engine": {"gone": False, "healthy_at_end": True, "exit_code": 0, "drift": judged},
    }
    failed = soak.verdict(report)
    assert len(failed) == 2 and "RSS grew" in failed[0] and "7 more open file descriptors" in failed[1]
    report["engine"]["drift"] = soak.drift(samples, {"fds": 13.0}, {"fds": 13.0}, soak.DriftLimits(1000, 2))
    assert soak.verdict(report) == []
