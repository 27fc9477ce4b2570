"""How well each cache model predicts sage's own engine's prefix-cache hits and preemptions.

Runs the chats of tests/test_sage_twin.py (24 turns of 4 interleaved chats over a shared system
prompt, mixed priorities, block size 4, 8 running, 64 tokens a step) through a real sage-tiny
engine on the CPU, one request at a time and then all at once, and prints per policy and mode
the engine's hit tokens and preemptions beside: the sage twin (the engine's admission and
chunked prefill), the twin with first-come-first-served admission, the twin with whole
prefills, and the simulator's radix model (`Simulator`, ``max_running=8``,
``max_prefill_tokens=64``), each with its error and the requests whose hits differ; then the
machine.

    PYTHONPATH=$PWD python benchmarks/sage_fidelity.py [--policies lru,lfu,s3fifo,arc] [--pool 45]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the engine runs are the test's (one copy)

import test_sage_twin as fidelity  # noqa: E402

from benchmarks._machine import machine_line  # noqa: E402
from engine_adapter.sim.simulator import Simulator  # noqa: E402
from engine_adapter.sim.twins.chats import chat_script  # noqa: E402
from engine_adapter.sim.twins.sage_run import simulate_sage  # noqa: E402
from engine_adapter.sim.twins.vllm_fidelity import ONE_AT_A_TIME_GAP_S  # noqa: E402


def _line(name: str, engine: fidelity.EngineRun, hits: list[int] | None, total: int, preemptions: int) -> str:
    base = sum(engine.cached_tokens)
    error = (total - base) / base if base else 0.0
    differing = 0 if hits is None else sum(a != b for a, b in zip(engine.cached_tokens, hits, strict=True))
    differ = "" if hits is None else f", {differing} requests differ"
    return f"    {name:<22} {total:5d} tokens ({error:+.1%}), {preemptions} preemptions{differ}"


def _models(run: fidelity.EngineRun, policy: str, pool: int, gap: float, script: Any) -> list[str]:
    workload = fidelity.twin_workload(script, run, gap)
    limits = {
        "max_num_seqs": fidelity.MAX_NUM_SEQS,
        "max_num_batched_tokens": fidelity.MAX_NUM_BATCHED_TOKENS,
    }
    lines = []
    for name, options in (
        ("sage twin", {}),
        ("twin, fcfs admission", {"admission": "fcfs"}),
        ("twin, whole prefills", {"chunked_prefill": False}),
    ):
        twin = simulate_sage(workload, policy, pool, **limits, **options)  # type: ignore[arg-type]
        lines.append(_line(name, run, twin.hit_tokens, sum(twin.hit_tokens), twin.preemptions))
    sim = Simulator(
        workload,
        policy,
        pool,
        cache_model="radix",
        max_running=fidelity.MAX_NUM_SEQS,
        max_prefill_tokens=fidelity.MAX_NUM_BATCHED_TOKENS,
    )
    row = sim.run()
    radix_hits = round(row.hit_rate * sum(r.input_len for r in workload.requests))
    lines.append(_line("radix model", run, None, radix_hits, row.preemptions))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="lru,lfu,s3fifo,arc")
    parser.add_argument("--pool", type=int, default=fidelity.POOL, help="the engine's --num-blocks")
    args = parser.parse_args()
    script = chat_script(**fidelity.SCRIPT)
    for policy in args.policies.split(","):
        one = fidelity.one_at_a_time(script, policy, args.pool)
        every = fidelity.all_at_once(one.prompts, policy, args.pool)
        for mode, run, gap in (("one at a time", one, ONE_AT_A_TIME_GAP_S), ("all at once", every, 0.0)):
            print(f"{policy}, {args.pool} blocks, {mode}: engine {sum(run.cached_tokens)} tokens, "
                  f"{run.preemptions} preemptions")  # fmt: skip
            for line in _models(run, policy, args.pool, gap, script):
                print(line, flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
