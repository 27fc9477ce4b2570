"""Packed linears run a bounded set of row counts (issue 49): oneDNN builds one primitive (about
0.5-0.8 MiB of JIT code) per input shape and keeps up to 1,024, so an engine that passed every
row count from 1 to 2,048 grew with the requests it served.

`padded_rows` as stated (exact to 8, then three significant bits, at most a quarter more rows);
the padded call gives every real row the bits of the unpadded call at the rows around each bucket
edge (the row invariance batch invariance rests on); and oneDNN itself, asked through its verbose
log in a fresh process, builds one primitive per bucket, not one per row count.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from engine_adapter.model.packed import EXACT_ROWS, PackedLinear, padded_rows

MAX_ROWS = 2048  # the engine's default --max-num-batched-tokens
BUCKETS = sorted({padded_rows(rows) for rows in range(1, MAX_ROWS + 1)})


def test_the_buckets_are_the_stated_set() -> None:
    assert BUCKETS[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))
    assert BUCKETS[EXACT_ROWS : EXACT_ROWS + 8] == [10, 12, 14, 16, 20, 24, 28, 32]
    assert len(BUCKETS) == 40 and BUCKETS[-1] == MAX_ROWS


@given(st.integers(1, 10**7))
def test_padding_is_bounded_and_idempotent(rows: int) -> None:
    padded = padded_rows(rows)
    assert rows <= padded <= rows * 1.25
    assert padded_rows(padded) == padded  # a bucket is its own bucket
    assert padded.bit_length() - (padded & -padded).bit_length() < 3  # three significant bits


def _unpadded(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    """The packed kernel on exactly `x`'s rows (what `PackedLinear` ran before it padded)."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, layer.packed, layer.bias, "none", [], "")
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_rows_equal_unpadded_rows_bit_for_bit_at_every_bucket_edge(dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN packs bfloat16 only on CPUs with AVX512-BW or AVX-NE-CONVERT")
    torch.manual_seed(0)
    layer = PackedLinear(nn.Linear(72, 40).to(dtype), min_rows=0)
    edges = sorted({r for b in BUCKETS if b > EXACT_ROWS for r in (b - 1, b, b + 1)})
    x = torch.randn(max(edges), 72).to(dtype)
    for rows in edges:
        assert padded_rows(rows) != rows or rows in BUCKETS
        got, want = layer(x[:rows]), _unpadded(layer, x[:rows])
        assert got.shape == want.shape == (rows, 40)
        assert torch.equal(got, want), f"{rows} rows (run as {padded_rows(rows)})"


_COUNT_PRIMITIVES = """
import sys, torch
from torch import nn
from engine_adapter.model.packed import PackedLinear
torch.manual_seed(0)
layer = PackedLinear(nn.Linear(32, 24), min_rows=0)
for rows in range(1, int(sys.argv[1]) + 1):
    layer(torch.randn(rows, 32))
"""


def test_onednn_builds_one_primitive_per_bucket_not_per_row_count() -> None:
    rows = 300
    env = os.environ | {"ONEDNN_VERBOSE": "profile_create", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", _COUNT_PRIMITIVES, str(rows)]
    log = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    built = [line for line in log.splitlines() if "create:cache_miss" in line and "inner_product" in line]
    assert len(built) == len({padded_rows(r) for r in range(1, rows + 1)}) == 29
