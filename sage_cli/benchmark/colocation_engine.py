"""`sage llm benchmark --mode engine --workload colocation`: LLM and embedding traffic through live
engines, one per colocation system, with measured latencies (issue 19).

The workload is the colocation simulator's (`engine_adapter.sim.colocation.workload.generate`:
the ratio, the arrival pattern, the output class, the seed), fitted to the engine it runs on:

1. calibration: on a temporary engine with colocation off, one request at a time, the
   unloaded TTFT and TPOT of an LLM request and the latency of a mean embedding batch;
2. capacity: the serial service rate of the mix, ``1 / (f * llm_time + (1 - f) * embedding_time)``
   for LLM fraction ``f`` (printed; the engine batches, so 100 % load is below its true limit);
3. the first `requests` requests of the generated stream, their arrivals rescaled to
   ``load * capacity``, prompts and outputs shortened (`max_output_tokens`, `prompt_tokens`),
   batches thinned (`text_divisor`); SLOs are `slo_factor` times the calibrated latencies;
4. each system on a fresh engine (``--colocation`` is fixed at start): the shared pool with no
   coordination (``off``, LRU), static 50/50 and 80/20, the spec's Algorithms 1-3 as written,
   sage's; and sage again with the embedding traffic removed (its TPOT reference).

Every request is replayed by `sage_cli.benchmark.replay.replay_requests` at its arrival time; the row
of each system is the simulator's (`engine_adapter.sim.colocation.metrics`) over measured
latencies, so the table reads like the simulator's.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sage_cli.benchmark.colocation import ColocationGrid, colocation_table
from sage_cli.benchmark.replay import (
    TOKEN_ID_RANGE,
    EngineRun,
    replay_requests,
    start_temporary_engine,
    timed_completion,
)
from sage_cli.client import ControlClient, SageClientError
from sage_cli.errors import CLIUsageError
from sage_cli.output import Output

__all__ = [
    "ENGINE_SYSTEMS",
    "EngineColocationSettings",
    "EngineRequest",
    "build_requests",
    "calibrate",
    "run_colocation_engine_benchmark",
    "run_on_engines",
]

# Systems that run on the engine (the simulator's other rows, ablations and admission-only
# baselines, need engine settings that do not exist).
ENGINE_SYSTEMS: dict[str, dict[str, Any]] = {
    "shared-lru": {"colocation": "off"},
    # plain partitions, as the simulator's: no admission control, the policy picks preemptions
    "static-50/50": {
        "colocation": "static:0.5",
        "colocation_params": {"admission": False, "slo_preemption": False},
    },
    "static-80/20": {
        "colocation": "static:0.8",
        "colocation_params": {"admission": False, "slo_preemption": False},
    },
    "spec": {"colocation": "dynamic", "colocation_params": {"system": "spec"}},
    "sage": {"colocation": "dynamic"},
}
NO_EMBEDDINGS = "sage, LLM only"


@dataclass(frozen=True)
class EngineRequest:
    """One request as the engine benchmark sends it.

    Attributes:
        kind: ``llm`` or ``embedding``.
        arrival_s: Seconds after the start of the replay.
        body: The JSON body (completions or embeddings).
        slo: ``(ttft_ms, tpot_ms)`` of an LLM request, ``(deadline_ms,)`` of an embedding one.
        tokens: Input tokens (prompt or all texts).
    """

    kind: str
    arrival_s: float
    body: dict[str, Any]
    slo: tuple[float, ...]
    tokens: int


@dataclass(frozen=True)
class Calibration:
    """Unloaded latencies on the engine, seconds."""

    ttft_s: float
    tpot_s: float
    embedding_s: float
    output_tokens: int

    @property
    def llm_s(self) -> float:
        return self.ttft_s + self.tpot_s * max(self.output_tokens - 1, 0)


def _ids(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, TOKEN_ID_RANGE) for _ in range(n)]


def _llm_body(template: int, suffix_seed: str, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    prefix = _ids(f"template-{template}", prompt_tokens // 2)  # shared by requests of a template
    return {
        "prompt": prefix + _ids(suffix_seed, prompt_tokens - len(prefix)),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


def calibrate(
    client: ControlClient, *, prompt_tokens: int, output_tokens: int, texts: int, text_tokens: int
) -> Calibration:
    """Median unloaded TTFT, TPOT and embedding latency of three requests each, one at a time."""
    ttfts: list[float] = []
    tpots: list[float] = []
    embeds: list[float] = []
    for i in range(3):
        run = timed_completion(client, _llm_body(0, f"calibrate-{i}", prompt_tokens, output_tokens))
        if not run.ok or run.ttft_s is None:
            raise RuntimeError(f"calibration request failed: {run.error}")
        ttfts.append(run.ttft_s)
        tpots.append(statistics.mean(run.tpot_s) if run.tpot_s else run.ttft_s)
        start = time.perf_counter()
        client.embeddings({"input": [_ids(f"calibrate-{i}-{t}", text_tokens) for t in range(texts)]})
        embeds.append(time.perf_counter() - start)
        client.reset_cache()
    return Calibration(
        statistics.median(ttfts), statistics.median(tpots), statistics.median(embeds), output_tokens
    )


def build_requests(
    workload: Any,
    calibration: Calibration,
    *,
    requests: int,
    load: float,
    slo_factor: float,
    prompt_tokens: int,
    max_output_tokens: int,
    text_divisor: int,
    text_tokens: int,
) -> tuple[list[EngineRequest], float]:
    """The first `requests` requests of the simulator's `workload`, fitted to the engine; and the
    engine's serial capacity of the mix in requests per second."""
    merged = sorted(
        [("llm", r.arrival_s, r) for r in workload.llm]
        + [("embedding", r.arrival_s, r) for r in workload.embeddings],
        key=lambda item: item[1],
    )[:requests]
    if not merged:
        raise ValueError("the workload has no request; give more --requests or a longer --duration")
    llm_fraction = sum(1 for kind, _, _ in merged if kind == "llm") / len(merged)
    capacity = 1.0 / (llm_fraction * calibration.llm_s + (1 - llm_fraction) * calibration.embedding_s)
    sim_span = max(merged[-1][1], 1e-9)
    stretch = (len(merged) / (load * capacity)) / sim_span  # engine seconds per simulated second
    out: list[EngineRequest] = []
    for kind, arrival, req in merged:
        if kind == "llm":
            # the output class's range scaled into 1..max_output_tokens (a CPU engine is slow)
            scaled = round(max_output_tokens * req.output_tokens / req.max_tokens)
            max_tokens = max(1, min(max_output_tokens, scaled))
            body = _llm_body(req.template, req.request_id, prompt_tokens, max_tokens)
            ttft_ms = 1e3 * slo_factor * calibration.ttft_s
            tpot_ms = 1e3 * slo_factor * calibration.tpot_s
            body.update(priority=int(req.priority), slo_ttft_ms=ttft_ms, slo_tpot_ms=tpot_ms)
            out.append(EngineRequest("llm", arrival * stretch, body, (ttft_ms, tpot_ms), prompt_tokens))
        else:
            texts = max(1, req.texts // text_divisor)
            length = min(text_tokens, req.max_text_tokens)
            deadline_ms = 1e3 * slo_factor * calibration.embedding_s
            body = {
                "input": [_ids(f"{req.request_id}-{t}", length) for t in range(texts)],
                "slo_deadline_ms": deadline_ms,
            }
            out.append(EngineRequest("embedding", arrival * stretch, body, (deadline_ms,), texts * length))
    return out, capacity


def _send(client: ControlClient, req: EngineRequest) -> EngineRun:
    """One request; an embedding's latency (arrival to whole answer) is kept as its `ttft_s`."""
    if req.kind == "llm":
        return timed_completion(client, req.body)
    run = EngineRun(prompt_tokens=req.tokens)
    start = time.perf_counter()
    try:
        client.embeddings(req.body, timeout=600.0)
        run.ok, run.ttft_s = True, time.perf_counter() - start
    except SageClientError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        run.status = int(getattr(exc, "status_code", 0) or 0)
    return run


def _result(
    name: str,
    reqs: Sequence[EngineRequest],
    runs: list[EngineRun],
    wall: float,
    before: dict[str, Any],
    after: dict[str, Any],
) -> Any:
    """The simulator's `RunResult` over what the replay measured."""
    from engine_adapter.sim.colocation import RunResult

    def delta(key: str) -> int:
        return int(float(after.get(key) or 0) - float(before.get(key) or 0))

    decisions = (after.get("colocation") or {}).get("decisions") or {}
    before_decisions = (before.get("colocation") or {}).get("decisions") or {}
    result = RunResult(system=name, total_blocks=int(after.get("total_blocks") or 0))
    for req, run in zip(reqs, runs, strict=True):
        if req.kind == "llm":
            result.llm_total += 1
            if run.ok and run.ttft_s is not None:
                result.llm_finished += 1
                result.ttft_s.append(run.ttft_s)
                result.tpot_s.extend(run.tpot_s)
                result.output_tokens += run.completion_tokens
                tpot = statistics.mean(run.tpot_s) if run.tpot_s else 0.0
                if run.ttft_s * 1e3 < req.slo[0] and tpot * 1e3 < req.slo[1]:
                    result.llm_met += 1
            elif run.status == 429:
                result.llm_rejected += 1
        else:
            result.embedding_total += 1
            if run.ok and run.ttft_s is not None:
                result.embedding_finished += 1
                result.embedding_latency_s.append(run.ttft_s)
                result.embedding_tokens += req.tokens
                if run.ttft_s * 1e3 < req.slo[0]:
                    result.embedding_met += 1
            elif run.status == 429:
                result.embedding_rejected += 1
    result.llm_deferred = int(decisions.get("llm:defer", 0)) - int(before_decisions.get("llm:defer", 0))
    result.preemptions = delta("preemptions")
    result.prompt_tokens = delta("prefix_cache_queries_tokens")
    result.hit_tokens = delta("prefix_cache_hits_tokens")
    result.makespan_s = wall
    result.lost = sum(1 for run in runs if not run.ok and run.status != 429)
    return result


@dataclass(frozen=True, slots=True)
class EngineColocationSettings:
    """What an engine colocation run does: the keyword arguments of `run_colocation_engine_benchmark`.

    Attributes:
        ratios: LLM:embedding ratios (``"7:3"``) or ``"shift"``.
        loads: Offered loads as fractions of the engine's serial capacity of the mix.
        arrival: poisson, bursty or periodic.
        output: The simulator's output class (scaled to `max_output_tokens` here).
        seed: Seed of the workload.
        requests: How many requests per cell (the first of the generated stream).
        systems: Names of `ENGINE_SYSTEMS` to run (default: all).
        engine: `EngineConfig` fields of every engine (model, num_blocks, block_size, device ...).
        slo_factor: SLOs are this many times the calibrated unloaded latencies.
        prompt_tokens: Prompt length of every LLM request (half of it shared per template).
        max_output_tokens: The longest output (the output class scales below it).
        text_divisor: An embedding batch of N texts sends N // text_divisor (at least 1).
        text_tokens: The longest embedding text.
        concurrency: Client threads.
        alpha: The spec's objective weight of LLM SLO attainment.
        beta: Its weight of embedding SLO attainment.
        gamma: Its weight of the completion ratio.
    """

    ratios: Sequence[str] = ("5:5",)
    loads: Sequence[float] = (1.0,)
    arrival: str = "poisson"
    output: str = "short"
    seed: int = 0
    requests: int = 48
    systems: Sequence[str] | None = None
    engine: dict[str, Any] | None = None
    slo_factor: float = 5.0
    prompt_tokens: int = 48
    max_output_tokens: int = 16
    text_divisor: int = 8
    text_tokens: int = 32
    concurrency: int = 64
    alpha: float = 0.5
    beta: float = 0.5
    gamma: float = 0.0

    @property
    def base_config(self) -> dict[str, Any]:
        """The config of every engine: a CPU engine of 256 blocks of 16 tokens unless `engine` says."""
        return {"device": "cpu", "num_blocks": 256, "block_size": 16, **(self.engine or {})}

    def system_names(self) -> list[str]:
        """The systems to run, checked.

        Raises:
            ValueError: A name `ENGINE_SYSTEMS` does not have.
        """
        names = list(self.systems) if self.systems is not None else list(ENGINE_SYSTEMS)
        unknown = [s for s in names if s not in ENGINE_SYSTEMS]
        if unknown:
            raise ValueError(
                f"unknown engine colocation system {unknown[0]!r}; known: {', '.join(ENGINE_SYSTEMS)}"
            )
        return names


def run_colocation_engine_benchmark(
    progress: Callable[[str], None] | None = None, **settings: Any
) -> dict[str, Any]:
    """Replay each (ratio, load) workload through a fresh engine per system; the simulator's rows.

    Args:
        progress: Called with each cell's and system's name as it starts.
        **settings: The fields of `EngineColocationSettings` (ratios, loads, requests, systems,
            engine, ...), each with its default when not given.

    Returns:
        The simulator benchmark's shape (``settings``, ``capacity`` by ratio, ``results`` rows
        with ``ratio``, ``load``, ``system`` and `metrics`' figures), plus ``mode: engine`` and
        the ``calibration``.

    Raises:
        ValueError: An unknown system, ratio, arrival pattern or output class.
        TypeError: A setting `EngineColocationSettings` does not have.
    """
    from engine_adapter.sim.colocation.workload import generate

    run = EngineColocationSettings(**settings)
    names = run.system_names()
    workloads = {
        r: generate(ratio=r, arrival=run.arrival, output=run.output, seed=run.seed, duration_s=600.0)
        for r in run.ratios
    }
    calibration, mean_texts = _calibrate_on_a_reference_engine(run)
    rows: list[dict[str, Any]] = []
    capacities: dict[str, float] = {}
    for ratio in run.ratios:
        for load in run.loads:
            reqs, capacities[ratio] = _fitted_requests(run, workloads[ratio], calibration, load)
            for name, settings_of_system, stream in _cells(names, reqs):
                if progress is not None:
                    progress(f"{ratio} at {load:.0%}: {name}")
                rows.append(_row(run, ratio, load, name, {**run.base_config, **settings_of_system}, stream))
    return _document(run, calibration, mean_texts, capacities, rows)


def _calibrate_on_a_reference_engine(run: EngineColocationSettings) -> tuple[Calibration, int]:
    """The unloaded latencies on a temporary engine with colocation off, and the texts of a mean
    embedding batch (thinned by `text_divisor`)."""
    from engine_adapter.sim.colocation.workload import BATCH_TEXTS

    mean_texts = max(1, round(statistics.mean(BATCH_TEXTS) / run.text_divisor))
    with (
        start_temporary_engine({**run.base_config, "colocation": "off"}) as reference,
        ControlClient(reference.socket, timeout=120.0) as client,
    ):
        calibration = calibrate(
            client,
            prompt_tokens=run.prompt_tokens,
            output_tokens=run.max_output_tokens // 2 or 1,
            texts=mean_texts,
            text_tokens=run.text_tokens,
        )
    return calibration, mean_texts


def _fitted_requests(
    run: EngineColocationSettings, workload: Any, calibration: Calibration, load: float
) -> tuple[list[EngineRequest], float]:
    """`build_requests` with the run's settings."""
    return build_requests(
        workload,
        calibration,
        requests=run.requests,
        load=load,
        slo_factor=run.slo_factor,
        prompt_tokens=run.prompt_tokens,
        max_output_tokens=run.max_output_tokens,
        text_divisor=run.text_divisor,
        text_tokens=run.text_tokens,
    )


def _cells(
    names: list[str], reqs: list[EngineRequest]
) -> list[tuple[str, dict[str, Any], list[EngineRequest]]]:
    """Each system with its engine settings and its requests; sage again on the LLM requests alone
    (its TPOT without the embedding traffic: the shared-compute reference)."""
    cells = [(name, ENGINE_SYSTEMS[name], reqs) for name in names]
    if "sage" in names:
        cells.append((NO_EMBEDDINGS, ENGINE_SYSTEMS["sage"], [r for r in reqs if r.kind == "llm"]))
    return cells


def _row(
    run: EngineColocationSettings,
    ratio: str,
    load: float,
    name: str,
    config: dict[str, Any],
    stream: list[EngineRequest],
) -> dict[str, Any]:
    """One system's row: the simulator's `metrics` over the replay on a fresh engine."""
    from engine_adapter.sim.colocation import metrics

    result = _run_system(name, config, stream, run.concurrency)
    return {
        "ratio": ratio,
        "load": load,
        "system": name,
        **metrics(result, run.alpha, run.beta, run.gamma),
        "lost": float(result.lost),
        "requests": float(len(stream)),
    }


def _document(
    run: EngineColocationSettings,
    calibration: Calibration,
    mean_texts: int,
    capacities: dict[str, float],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """The result, in the simulator benchmark's shape."""
    return {
        "mode": "engine",
        "settings": {
            "compute": "shared (engine)",
            "arrival": run.arrival,
            "output_length": run.output,
            "seeds": [run.seed],
            "requests": run.requests,
            "slo_factor": run.slo_factor,
            "alpha": run.alpha,
            "beta": run.beta,
            "gamma": run.gamma,
            "engine": run.base_config,
        },
        "calibration": {
            "ttft_s": calibration.ttft_s,
            "tpot_s": calibration.tpot_s,
            "embedding_s": calibration.embedding_s,
            "embedding_texts": mean_texts,
            "text_tokens": run.text_tokens,
        },
        "capacity": capacities,
        "results": rows,
    }


def _run_system(name: str, config: dict[str, Any], stream: list[EngineRequest], concurrency: int) -> Any:
    """Replay `stream` through a fresh engine of `config`; the simulator's `RunResult`."""
    with (
        start_temporary_engine(config) as temporary,
        ControlClient(temporary.socket, timeout=120.0) as client,
    ):
        before = client.eviction_stats()
        runs, wall = replay_requests(
            stream,
            lambda req: _send(client, req),
            time_scale=1.0,
            concurrency=concurrency,
            tick=lambda: None,
        )
        after = client.eviction_stats()
    return _result(name, stream, runs, wall, before, after)


def run_on_engines(grid: ColocationGrid) -> None:
    """``sage llm benchmark --mode engine --workload colocation``: check what the engine mode
    takes, run the grid on temporary engines, print the simulator's table (or JSON).

    Raises:
        CLIUsageError: An option the engine mode cannot honour, or a bad system name.
    """
    from rich.console import Console

    _check_engine_grid(grid)
    console = Console(stderr=True)
    engine: dict[str, Any] = {"num_blocks": grid.num_blocks} if grid.num_blocks is not None else {}
    try:
        result = run_colocation_engine_benchmark(
            ratios=grid.ratios,
            loads=grid.loads,
            arrival=grid.arrival,
            output=grid.output_length,
            seed=grid.seeds[0],
            requests=grid.requests if grid.requests is not None else 48,
            systems=grid.systems,
            engine=engine,
            alpha=grid.alpha,
            beta=grid.beta,
            gamma=grid.gamma,
            progress=lambda what: console.print(f"[dim]{what}[/dim]") if console.is_terminal else None,
        )
    except (ValueError, RuntimeError) as exc:
        raise CLIUsageError(str(exc)) from None
    if grid.output is not None:
        grid.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    Output(grid.json_out).result(result, lambda: colocation_table(result), wide=True)


def _check_engine_grid(grid: ColocationGrid) -> None:
    """What the engine mode cannot honour: split compute, a duration, several seeds, systems
    with no engine setting."""
    if grid.compute != "shared":
        raise CLIUsageError("--mode engine runs LLM steps and embeddings on one engine: --compute shared")
    if grid.duration is not None:
        raise CLIUsageError("--mode engine sends --requests requests (default 48), not a --duration")
    if len(grid.seeds) > 1:
        raise CLIUsageError("--mode engine runs one seed (each run starts engines): one --seeds")
    if grid.systems is not None:
        unknown = [s for s in grid.systems if s not in ENGINE_SYSTEMS]
        if unknown:
            raise CLIUsageError(
                f"--systems {unknown[0]!r} has no engine setting; the engine runs {', '.join(ENGINE_SYSTEMS)}"
            )
