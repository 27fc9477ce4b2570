"""`benchmarks/soak.py` as a real process: a few seconds of mixed load on a sage-tiny engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
