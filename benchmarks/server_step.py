"""The decode step of the bare decoder against the same step inside the running engine.

Target (issue 27): the in-server decode step within 10 % of the bare decoder's, at batch 1 and 8,
same model, same threads.

Three figures per batch size B, each the median over the decode steps of `--repeats` rounds
(after one warm-up round), the rounds of the three interleaved so that the machine's other
load falls on all of them alike:

- bare: the decoder alone on B random prompts of `--prompt-len` tokens, `--decode-steps` steps of
  one token per sequence (forward, then a greedy argmax), on the engine's own thread (the same
  OpenMP team and threads as the engine's steps) while its loop is idle.
- engine: an in-process `Engine` decoding B requests of the same lengths (greedy, ignore_eos,
  submitted together so that they are admitted in one step):
  its forward (`StepStats.forward_s`), its whole `Scheduler.step()` (admission, reservation,
  sampling, detokenizing, caching) and its loop's period (the step plus the loop's own work:
  inbox, control jobs, gauges), over the steps that decode B tokens and prefill none.
- server (``--server``): an engine process (``python -m engine_adapter.serving.server``), B
  streamed completions at once over its socket: the mean interval between two chunks over the
  second half of each stream, which is the server's decode step as a client sees it. Its
  requests arrive one by one, so its batch is ragged (different lengths): compare it with a
  ``--ragged`` run's bare step, where prompt i has `--prompt-len` + i tokens and the decoder
  masks its attention. The client's threads share the machine's cores with the server: on 2
  cores, read it beside the server's own CPU use (``top -H -p PID``).

    python benchmarks/server_step.py                     # smollm2-135m, batch 1 and 8, all cores
    python benchmarks/server_step.py --threads 1 --server --ragged
    python benchmarks/server_step.py --model sage-tiny --batch-sizes 1,4 --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model import ForwardBatch
from engine_adapter.model.builtin import default_model_name
from engine_adapter.model.sampling import SamplingParams
from engine_adapter.serving.config import EngineConfig
from engine_adapter.serving.engine import Engine
from engine_adapter.serving.engine_thread import usable_cores
from engine_adapter.serving.sequence import StepStats

BLOCK_SIZE = 16
TARGET = 1.10


def _prompts(batch: int, length: int, seed: int, ragged: bool) -> list[list[int]]:
    """B random prompts of `length` tokens, or of length, length + 1, ... when `ragged`."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (batch, length + batch), generator=generator).tolist()
    return [row[: length + (i if ragged else 0)] for i, row in enumerate(ids)]


def bare_round(engine: Engine, prompts: list[list[int]], decode_steps: int) -> dict[str, list[float]]:
    """The decoder alone (run this on the engine thread): forward and forward + argmax per step."""
    decoder, batch, lengths = engine.decoder, len(prompts), [len(p) for p in prompts]
    blocks = -(-(max(lengths) + decode_steps) // BLOCK_SIZE)
    pool = decoder.make_pool(num_blocks=batch * blocks, block_size=BLOCK_SIZE)
    tables = [pool.allocator.allocate(blocks) for _ in range(batch)]
    tokens = decoder(ForwardBatch(prompts, [0] * batch, tables), pool).logits.argmax(-1).tolist()
    forward, step = [], []
    for i in range(decode_steps):
        start = time.perf_counter()
        out = decoder(ForwardBatch([[t] for t in tokens], [n + i for n in lengths], tables), pool)
        middle = time.perf_counter()
        tokens = out.logits.argmax(-1).tolist()
        end = time.perf_counter()
        forward.append(middle - start)
        step.append(end - start)
    return {"forward": forward, "step": step}


class StepRecorder:
    """Wraps the engine's `Scheduler.step` (the real one runs) to note each step's times."""

    def __init__(self, engine: Engine) -> None:
        self.inner = engine.scheduler.step
        self.rows: list[tuple[float, float, StepStats]] = []  # (start, wall, stats)
        engine.scheduler.step = self  # type: ignore[method-assign]

    def __call__(self) -> StepStats:
        start = time.perf_counter()
        stats = self.inner()
        self.rows.append((start, time.perf_counter() - start, stats))
        return stats


def engine_round(
    engine: Engine, recorder: StepRecorder, prompts: list[list[int]], decode_steps: int
) -> dict[str, list[float]]:
    """B requests through the running engine; the times of its steps that decode B tokens."""
    recorder.rows.clear()
    sampling = SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True, temperature=0.0)
    # All B in one step, as the bare batch: a request admitted a step before the others would
    # make the batch ragged, and a ragged batch takes the decoder's masked attention.
    with engine.cache.lock:
        handles = [engine.submit(p, sampling) for p in prompts]
    for handle in handles:
        handle.result(timeout=600)
    engine.reset_prefix_cache()  # the next round starts from an empty cache
    rows = recorder.rows
    out: dict[str, list[float]] = {"forward": [], "step": [], "loop": []}
    for (start, wall, stats), (next_start, _, next_stats) in itertools.pairwise(rows):
        if stats.decode_tokens == len(prompts) and stats.prefill_tokens == 0 and not stats.finished:
            out["forward"].append(stats.forward_s)
            out["step"].append(wall)
            if next_stats.decode_tokens == len(prompts):
                out["loop"].append(next_start - start)
    return out


def server_round(sock: Path, prompts: list[list[int]], decode_steps: int) -> list[float]:
    """B streamed completions at once; the decode step each stream saw (see below)."""
    import httpx

    gaps: list[list[float]] = [[] for _ in prompts]

    def stream(i: int) -> None:
        transport = httpx.HTTPTransport(uds=str(sock))
        body = {"prompt": prompts[i], "max_tokens": decode_steps + 1, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(transport=transport, base_url="http://sage", timeout=600) as http,
            http.stream("POST", "/v1/completions", json=body) as answer,
        ):
            last = None
            for line in answer.iter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.perf_counter()
                if last is not None:
                    gaps[i].append(now - last)
                last = now

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://sage") as http:
        http.post("/v1/cache/reset").raise_for_status()
    # Per stream, the mean gap over its second half, when every request has arrived and been
    # prefilled; a mean, since the socket may hand two events over at once (a gap of ~0, then
    # one twice as long), and one event a token (SmolLM2's tokens each carry text).
    return [statistics.fmean(g[len(g) // 2 :]) for g in gaps if len(g) >= 2]


class ServerProcess:
    """An engine process on a socket in a fresh folder, stopped (killed if need be) on exit."""

    def __init__(self, model: str, threads: int, num_blocks: int) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sage-step-", dir="/tmp"))
        self.sock = self.folder / "e.sock"
        config = {
            "model": model,
            "socket": str(self.sock),
            "log_dir": str(self.folder),
            "device": "cpu",
            "num_blocks": num_blocks,
            "threads": threads,
            "max_num_seqs": 64,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_adapter.serving.server", "--config-json", json.dumps(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[1],
        )

    def __enter__(self) -> ServerProcess:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited with {self.proc.returncode}")
            try:
                with httpx.Client(
                    transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://s"
                ) as h:
                    h.get("/health").raise_for_status()
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the engine did not answer within 300 s")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def _median_ms(values: list[float]) -> float | None:
    return statistics.median(values) * 1e3 if values else None


def measure_batch(
    engine: Engine, recorder: StepRecorder, server: ServerProcess | None, args: argparse.Namespace, batch: int
) -> dict[str, Any]:
    """Interleaved rounds of bare, engine (and server) at one batch size; the first is warm-up."""
    bare: dict[str, list[float]] = {"forward": [], "step": []}
    inside: dict[str, list[float]] = {"forward": [], "step": [], "loop": []}
    served: list[float] = []
    for r in range(args.repeats + 1):
        prompts = _prompts(batch, args.prompt_len, 1000 * batch + r, args.ragged)
        b = engine.engine_thread.call(bare_round, engine, prompts, args.decode_steps)
        e = engine_round(engine, recorder, prompts, args.decode_steps)
        s = server_round(server.sock, prompts, args.decode_steps) if server is not None else []
        if r == 0:
            continue
        for key in bare:
            bare[key] += b[key]
        for key in inside:
            inside[key] += e[key]
        served += s
    row: dict[str, Any] = {"batch": batch, "decode_steps_measured": len(inside["step"])}
    row.update({f"bare_{k}_ms": _median_ms(v) for k, v in bare.items()})
    row.update({f"engine_{k}_ms": _median_ms(v) for k, v in inside.items()})
    row["server_step_ms"] = _median_ms(served)
    return row


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="default: smollm2-135m when installed, else sage-tiny")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable cores)")
    parser.add_argument("--server", action="store_true", help="also through an engine process's socket")
    parser.add_argument(
        "--ragged",
        action="store_true",
        help="prompt i has prompt-len + i tokens: the decoder's masked attention",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    model = args.model or default_model_name()
    threads = args.threads or usable_cores()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    blocks = max(batches) * -(-(args.prompt_len + args.decode_steps + 1) // BLOCK_SIZE) * 2
    folder = Path(tempfile.mkdtemp(prefix="sage-step-", dir="/tmp"))
    config = EngineConfig(
        model=model,
        device="cpu",
        threads=threads,
        num_blocks=blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=64,
        name="step-bench",
        socket=str(folder / "unused.sock"),
        log_dir=str(folder),
    )
    engine = Engine(config)
    recorder = StepRecorder(engine)
    engine.start()
    server = ServerProcess(model, threads, blocks) if args.server else None
    try:
        if server is not None:
            server.__enter__()
        rows = [measure_batch(engine, recorder, server, args, b) for b in batches]
        info = engine.info()
    finally:
        if server is not None:
            server.__exit__()
        engine.shutdown(drain=False, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "machine": machine_line(),
        "setup": {
            "model": model,
            "threads": info["threads"],
            "prompt_len": args.prompt_len,
            "ragged": args.ragged,
            "decode_steps": args.decode_steps,
            "repeats": args.repeats,
        },
        "results": rows,
    }


COLUMNS = (  # (heading, key) of the times
    ("bare fwd", "bare_forward_ms"),
    ("bare step", "bare_step_ms"),
    ("eng fwd", "engine_forward_ms"),
    ("eng step", "engine_step_ms"),
    ("eng loop", "engine_loop_ms"),
    ("server", "server_step_ms"),
)
RATIOS = (  # (heading, key, the bare figure it is compared with)
    ("fwd", "engine_forward_ms", "bare_forward_ms"),
    ("step", "engine_step_ms", "bare_step_ms"),
    ("loop", "engine_loop_ms", "bare_step_ms"),
    ("server", "server_step_ms", "bare_step_ms"),
)


def _cell(row: dict[str, Any], key: str, base: str | None = None) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if base is None:
        return f"{value:.2f}"
    return f"{value / row[base]:.2f}x"


def print_tables(report: dict[str, Any]) -> None:
    setup, threads = report["setup"], report["setup"]["threads"]
    print(f"machine: {report['machine']}")
    warnings = f"; warnings: {threads['warnings']}" if threads["warnings"] else ""
    print(
        f"setup:   model={setup['model']}, threads={threads['torch_threads']} of {threads['cores']} cores, "
        f"prompt_len={setup['prompt_len']}{' + i (ragged)' if setup['ragged'] else ''}, "
        f"decode_steps={setup['decode_steps']}, "
        f"repeats={setup['repeats']}{warnings}"
    )
    print("decode step, median ms, and its ratio to the bare decoder's (target: the engine's loop")
    print(f"period, and the server's step when measured, <= {TARGET:.2f}x the bare step)")
    heads = [h for h, _ in COLUMNS] + [f"{h}/bare" for h, _, _ in RATIOS]
    print("batch" + "".join(f"{h:>12}" for h in heads) + "  target")
    for row in report["results"]:
        cells = [_cell(row, key) for _, key in COLUMNS] + [_cell(row, k, b) for _, k, b in RATIOS]
        measured = [row[k] for k in ("engine_loop_ms", "server_step_ms") if row.get(k) is not None]
        verdict = "PASS" if all(v <= TARGET * row["bare_step_ms"] for v in measured) else "MISS"
        print(f"{row['batch']:>5}" + "".join(f"{c:>12}" for c in cells) + f"  {verdict}")


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    report = measure(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_tables(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
