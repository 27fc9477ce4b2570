"""What the linears' bounded row counts cost (issue 49; the price of the flat soak).

A packed call's rows are padded up to `padded_rows` (exact to 8, then three significant bits) so
that oneDNN builds one primitive per bucket, not one per row count (engine_adapter/model/packed.py);
so are a plain layer's in bfloat16 on a CPU where ``F.linear`` is a oneDNN matmul
(`BucketedLinear`). Here: one SmolLM2-135M layer's seven linears (q, k, v, o, gate, up, down; one
thread), padded against the same kernel on exactly the rows (``--kind packed``: `PackedLinear`,
float32; ``--kind bucketed``: `BucketedLinear` against ``F.linear``, bfloat16), at the rows just past
each bucket edge (the worst case: up to a quarter more rows) and at the edges themselves (no
padding: what is left is the measurement's noise). Best of ``--repeats`` alternated runs of the
thread's CPU time, not wall time: the machine is shared, and CPU time does not count the waits.

    python benchmarks/soak_padding.py
    python benchmarks/soak_padding.py --kind bucketed
    python benchmarks/soak_padding.py --rows 9,100,129,1025 --repeats 30
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model.packed import BucketedLinear, PackedLinear, padded_rows

# SmolLM2-135M's layer: (in, out) of q, k, v, o, gate, up, down.
SHAPES = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
EDGES = "9,10,17,20,33,40,65,80,129,160,257,320,513,640,1025,1280"

Run = Callable[[list[torch.Tensor]], object]


def _best(run: Run, inputs: list[torch.Tensor], repeats: int) -> float:
    run(inputs)
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        run(inputs)
        best = min(best, time.thread_time() - start)
    return best


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", default=EDGES, help="row counts to time (default: around the bucket edges)")
    parser.add_argument("--repeats", type=int, default=20, help="runs per kernel and row count (best taken)")
    parser.add_argument(
        "--kind",
        choices=("packed", "bucketed"),
        default="packed",
        help="packed: PackedLinear, float32 (default); bucketed: BucketedLinear, bfloat16",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = torch.float32 if args.kind == "packed" else torch.bfloat16
    plain_layers = [nn.Linear(i, o, bias=False).to(dtype) for i, o in SHAPES]
    if args.kind == "packed":
        layers: list[nn.Module] = [PackedLinear(layer, min_rows=0) for layer in plain_layers]
    else:
        layers = [BucketedLinear(layer) for layer in plain_layers]

    def padded(xs: list[torch.Tensor]) -> object:
        return [layer(x) for layer, x in zip(layers, xs, strict=True)]

    def exact(xs: list[torch.Tensor]) -> object:
        if args.kind == "bucketed":
            return [layer(x) for layer, x in zip(plain_layers, xs, strict=True)]
        kernel = torch.ops.mkldnn._linear_pointwise
        return [kernel(x, layer.packed, None, "none", [], "") for layer, x in zip(layers, xs, strict=True)]

    print(f"# {machine_line()}; torch threads 1")
    kind = f"{args.kind} linears, {str(dtype).removeprefix('torch.')}"
    print(f"# one SmolLM2 layer's 7 {kind}; best thread CPU time")
    print("| rows | run as | exact ms | padded ms | padded / exact |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = [torch.randn(rows, i).to(dtype) for i, _ in SHAPES]
        plain = fast = float("inf")
        for _ in range(4):  # alternated, so that a busy moment falls on both
            plain = min(plain, _best(exact, inputs, args.repeats // 4 + 1))
            fast = min(fast, _best(padded, inputs, args.repeats // 4 + 1))
        ms = f"{plain * 1e3:.2f} | {fast * 1e3:.2f}"
        print(f"| {rows} | {padded_rows(rows)} | {ms} | {fast / plain:.2f}x |")


if __name__ == "__main__":
    main()
