"""The vllm twin against a recorded vLLM run, request by request.

`replay_engine_runs` takes what tests_integration/vllm/twin_run.py records (per pool size and
mode: the prompts vLLM got, the tokens it generated, each request's `num_cached_tokens` and its
preemption counter) and replays the same sequence through the twin: one pool per pool size,
the modes in turn with the prefix cache reset between them, as the engine ran them. Each
`Fidelity` holds both sides; `differing` lists the requests whose hits differ.

Pure Python: the recorded run is plain JSON, so this runs without vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_adapter.sim.twins.chats import ChatScript, token_workload
from engine_adapter.sim.twins.vllm_pool import BlockPool
from engine_adapter.sim.twins.vllm_run import make_pool, simulate_vllm
from engine_adapter.sim.workloads import Workload

__all__ = ["ONE_AT_A_TIME_GAP_S", "Fidelity", "replay_engine_runs", "run_workload"]

ONE_AT_A_TIME_GAP_S = 1e6
"""Seconds between arrivals that make every request run alone (far beyond any request's time)."""


@dataclass(frozen=True, slots=True)
class Fidelity:
    """One recorded run and the twin's replay of it."""

    num_gpu_blocks: int
    mode: str  # "one" (one at a time) or "all" (all at once)
    engine_hits: list[int]
    twin_hits: list[int]
    engine_preemptions: int
    twin_preemptions: int

    @property
    def differing(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.engine_hits, self.twin_hits, strict=True)) if a != b]

    @property
    def error(self) -> float:
        """The twin's total hits relative to the engine's (0.0: equal)."""
        engine = sum(self.engine_hits)
        return (sum(self.twin_hits) - engine) / engine if engine else float(sum(self.twin_hits) > 0)


def run_workload(script: ChatScript, run: Mapping[str, Any], block_size: int = 32) -> Workload:
    """The simulator's workload of one recorded run (one at a time, or all at once)."""
    gap = ONE_AT_A_TIME_GAP_S if run["mode"] == "one" else 0.0
    return token_workload(script, run["prompts"], run["outputs"], block_size=block_size, gap_s=gap)


def replay_engine_runs(
    script: ChatScript,
    runs: Sequence[Mapping[str, Any]],
    policy: str = "lru",
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int = 32,
) -> list[Fidelity]:
    """The twin's replay of each recorded run, in order, one pool per pool size."""
    pools: dict[int, BlockPool] = {}
    out = []
    for run in runs:
        blocks = int(run["num_gpu_blocks"])
        pool = pools.get(blocks)
        if pool is None:
            pool = pools[blocks] = make_pool(policy, blocks, block_size)
        elif not pool.reset_prefix_cache():
            raise RuntimeError(f"the twin's pool of {blocks} blocks still holds blocks between runs")
        twin = simulate_vllm(
            run_workload(script, run, block_size),
            policy,
            blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            pool=pool,
        )
        preempted = int(run["counters"].get("vllm:num_preemptions", 0))
        out.append(Fidelity(blocks, run["mode"], list(run["num_cached_tokens"]), twin.hit_tokens, preempted,
                            twin.preemptions))  # fmt: skip
    return out
