"""The engine's warm-up builds every packed-linear row bucket before the first request (issue 49).

A bucket's oneDNN primitive is built the first time a step brings its row count, and with it the
activation buffers reach a new high-water mark: a step in the RSS of a long soak, hours in. The
engine's warm-up (`engine_parts.warm_up`, on the engine thread) runs every packed weight shape at
every bucket a step can reach, so that afterwards no step of any row count up to
``max_num_batched_tokens`` (and of any number of sequences up to ``max_num_seqs``) makes oneDNN
build a primitive: asked through its verbose log, in a fresh process (the primitive cache is the
process's), where the old one-token warm-up leaves the steps building one per bucket and shape.
`warm_buckets` alone on a few packed layers, and the engine's warm-up before a real decoder's steps
(a fresh process loading sage-tiny, about 20 s): both in the slow loop (fresh processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_adapter.model.packed import padded_rows, row_buckets

MAX_ROWS, MAX_SEQS = 64, 8

_CALLS_AFTER_WARM_BUCKETS = """
import os, sys, torch
from torch import nn
from engine_adapter.model.packed import PackedLinear, warm_buckets

torch.manual_seed(0)
model = nn.Module()
model.up = PackedLinear(nn.Linear(48, 80), min_rows=0)
model.down = PackedLinear(nn.Linear(80, 48, bias=False), min_rows=4)  # below 4 rows: F.linear
model.lm_head = PackedLinear(nn.Linear(48, 200, bias=False), min_rows=0)
max_rows, max_seqs, step_rows, step_seqs = map(int, sys.argv[1:5])
warm_buckets(model, max_rows, max_seqs)
sys.stdout.flush()
os.write(1, b"STEPS\\n")
with torch.inference_mode():
    for rows in range(1, step_rows + 1):
        model.down(model.up(torch.randn(rows, 48)))
    for rows in range(1, step_seqs + 1):
        model.lm_head(torch.randn(rows, 48))
"""

_STEPS_AFTER_WARM_UP = """
import os, sys
from engine_adapter.model.decoder import ForwardBatch
from engine_adapter.model.loader import load_model
from engine_adapter.serving.engine_parts import warm_up

max_rows, max_seqs, step_rows, step_seqs = map(int, sys.argv[1:5])
decoder, _, _ = load_model("sage-tiny", device="cpu", dtype=sys.argv[5], batch_invariant="on")
warm_up(decoder, 16, max_rows, max_seqs)
pool = decoder.make_pool(num_blocks=32, block_size=16)
table = pool.allocator.allocate(step_rows // 16 + 1)
sys.stdout.flush()
os.write(1, b"STEPS\\n")
for rows in range(1, step_rows + 1):  # one prefill of every row count
    decoder(ForwardBatch([[0] * rows], [0], [table]), pool)
for seqs in range(1, step_seqs + 1):  # one decode step of every batch size: the lm head's rows
    decoder(ForwardBatch([[0]] * seqs, [rows] * seqs, [table] * seqs), pool)
"""


def _primitives_built_by_the_steps(script: str, max_rows: int, max_seqs: int, *args: str) -> list[str]:
    """oneDNN's primitive builds (cache misses) during `script`'s steps (to `MAX_ROWS` rows and
    `MAX_SEQS` sequences), after its warm-up to `max_rows` rows and `max_seqs` sequences."""
    env = os.environ | {"ONEDNN_VERBOSE": "profile_create", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", script, *map(str, (max_rows, max_seqs, MAX_ROWS, MAX_SEQS)), *args]
    log = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=300).stdout
    assert "STEPS" in log, log[-2000:]
    steps = log.split("STEPS", 1)[1]
    return [line for line in steps.splitlines() if "create:cache_miss" in line]


def _skip_without_onednn() -> None:
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        pytest.skip("packed linears need oneDNN, which this torch build lacks")


@pytest.mark.slow  # two fresh processes (torch's import: about 5 s each on the 2-core machine)
def test_after_warm_buckets_no_call_builds_a_primitive() -> None:
    """Every row count to `MAX_ROWS` through two layers (one of them plain below 4 rows), every
    one to `MAX_SEQS` through the lm head: nothing left to build; the control, warmed to 0 rows,
    builds one primitive per bucket and shape."""
    _skip_without_onednn()
    assert _primitives_built_by_the_steps(_CALLS_AFTER_WARM_BUCKETS, MAX_ROWS, MAX_SEQS) == []
    cold = _primitives_built_by_the_steps(_CALLS_AFTER_WARM_BUCKETS, 0, 0)
    built = [line for line in cold if "inner_product" in line]
    assert len(built) == len(row_buckets(1, MAX_ROWS)) + len(row_buckets(4, MAX_ROWS)) + MAX_SEQS


@pytest.mark.slow  # two fresh processes that load sage-tiny (about 20 s each on the 2-core machine)
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_after_the_engines_warm_up_no_step_builds_a_primitive(dtype: str) -> None:
    """The engine's warm-up, then a prefill of every row count to `MAX_ROWS` and a decode step of
    every batch to `MAX_SEQS` on sage-tiny: no primitive built; after the one-token warm-up alone
    (the control) the steps build one per bucket the load's probes left. In bfloat16 (a CPU
    where oneDNN runs it) the layers stay plain, ``F.linear`` is a oneDNN matmul, and the
    bucketing (`BucketedLinear`) is what keeps the steps from building one per row count."""
    _skip_without_onednn()
    if dtype == "bf16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip(
            "oneDNN packs bfloat16 only on CPUs with AVX512-BW or AVX-NE-CONVERT (no bf16 matmul either)"
        )
    assert _primitives_built_by_the_steps(_STEPS_AFTER_WARM_UP, MAX_ROWS, MAX_SEQS, dtype) == []
    cold = _primitives_built_by_the_steps(_STEPS_AFTER_WARM_UP, 1, 1, dtype)
    kernel = "inner_product" if dtype == "float32" else ",matmul,"
    assert len([line for line in cold if kernel in line]) >= len(row_buckets(9, MAX_ROWS))


def test_row_buckets_are_the_padded_row_counts() -> None:
    for lo, hi in [(1, 1), (1, 64), (0, 2048), (9, 100), (3, 2), (1000, 5000)]:
        assert row_buckets(lo, hi) == sorted({padded_rows(r) for r in range(max(lo, 1), hi + 1)})
