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

from engine_adapter.model import loader
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.loader import load_model, weights_digest
from engine_adapter.model.packed import (
    EXACT_ROWS,
    BucketedLinear,
    PackedLinear,
    builds_per_row_count,
    padded_rows,
)

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


def _primitives_built(script: str, rows: int) -> list[str]:
    """oneDNN's primitive builds (cache misses) while `script` runs 1 to `rows` rows, in a fresh
    process (the primitive cache is the process's)."""
    env = os.environ | {"ONEDNN_VERBOSE": "profile_create", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-c", script, str(rows)]
    log = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return [line for line in log.splitlines() if "create:cache_miss" in line]


def test_onednn_builds_one_primitive_per_bucket_not_per_row_count() -> None:
    rows = 300
    built = [line for line in _primitives_built(_COUNT_PRIMITIVES, rows) if "inner_product" in line]
    assert len(built) == len({padded_rows(r) for r in range(1, rows + 1)}) == 29


# ---- plain layers in bfloat16: F.linear is a oneDNN matmul, built per row count ------------------

NO_BF16_MATMUL = "oneDNN packs bfloat16 only on CPUs with AVX512-BW or AVX-NE-CONVERT (no bf16 matmul either)"


def _skip_without_bf16_matmul() -> None:
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):  # type: ignore[no-untyped-call]
        pytest.skip(NO_BF16_MATMUL)


def test_bucketed_rows_equal_plain_rows_bit_for_bit_at_every_bucket_edge() -> None:
    """`BucketedLinear` pads a call's rows with zeros up to its bucket; every real row gets the
    bits ``F.linear`` gives it on exactly the real rows."""
    _skip_without_bf16_matmul()
    torch.manual_seed(0)
    plain = nn.Linear(72, 40).to(torch.bfloat16)
    layer = BucketedLinear(plain)
    edges = sorted({r for b in BUCKETS if b > EXACT_ROWS for r in (b - 1, b, b + 1)} | set(range(1, 12)))
    x = torch.randn(max(edges), 72).to(torch.bfloat16)
    with torch.inference_mode():
        for rows in edges:
            got, want = layer(x[:rows]), plain(x[:rows])
            assert got.shape == want.shape == (rows, 40)
            assert torch.equal(got, want), f"{rows} rows (run as {padded_rows(rows)})"
        # a leading batch dimension, as the decoder's calls have
        assert torch.equal(layer(x[:30].view(3, 10, 72)), plain(x[:30].view(3, 10, 72)))


_COUNT_BF16_MATMULS = """
import sys, torch
from torch import nn
from engine_adapter.model.packed import BucketedLinear
torch.manual_seed(0)
plain = nn.Linear(32, 24).to(torch.bfloat16)
layer = BucketedLinear(plain) if sys.argv[2] == "bucketed" else plain
with torch.inference_mode():
    for rows in range(1, int(sys.argv[1]) + 1):
        layer(torch.randn(rows, 32).to(torch.bfloat16))
"""


@pytest.mark.slow  # two fresh processes (torch's import)
def test_a_bucketed_bf16_layer_builds_one_matmul_per_bucket_where_plain_builds_one_per_row_count() -> None:
    """The leak issue 49's SmolLM2 soak found on a CPU with native bfloat16 (70 MiB per 10,000
    requests): plain ``F.linear`` builds a oneDNN matmul per row count; bucketed, one per bucket."""
    _skip_without_bf16_matmul()
    rows = 300

    def matmuls(kind: str) -> int:
        script = _COUNT_BF16_MATMULS.replace('sys.argv[2] == "bucketed"', repr(kind == "bucketed"))
        return len([line for line in _primitives_built(script, rows) if ",matmul," in line])

    # one per row count, but for the few smallest, which torch runs another way (1 to 5 rows here)
    others = rows - matmuls("plain")
    assert 0 <= others <= EXACT_ROWS
    # bucketed: one per bucket (the smallest are their own buckets, run the other way as well)
    assert matmuls("bucketed") == len({padded_rows(r) for r in range(1, rows + 1)}) - others == 29 - others


def test_the_loader_buckets_the_plain_layers_of_a_bf16_model_and_keeps_its_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU where oneDNN runs bfloat16, every dense layer left plain (not packed) of a bf16
    model becomes a `BucketedLinear` on the same parameters: the state dict's names and bytes
    (`weights_digest`) are those of the model loaded without the bucketing step, and a tied lm
    head stays tied; float32 is left as it is (MKL's GEMM builds nothing per shape)."""
    _skip_without_bf16_matmul()
    for invariant in ("on", "off"):
        decoder, _, _ = load_model("sage-tiny", device="cpu", dtype="bf16", batch_invariant=invariant)
        assert builds_per_row_count(decoder)
        assert not [name for name, m in decoder.named_modules() if type(m) is nn.Linear]
        bucketed = [m for m in decoder.modules() if isinstance(m, BucketedLinear)]
        packed = [m for m in decoder.modules() if isinstance(m, PackedLinear)]
        assert bucketed and len(bucketed) + len(packed) == _dense_layers(decoder)
        if decoder.config.tie_word_embeddings:
            assert decoder.lm_head.weight is decoder.embed_tokens.weight
    monkeypatch.setattr(loader, "bucket_plain_linears", lambda decoder: 0)
    unbucketed, _, _ = load_model("sage-tiny", device="cpu", dtype="bf16", batch_invariant="off")
    assert [type(m) for m in unbucketed.modules()].count(nn.Linear) == _dense_layers(unbucketed)
    assert list(unbucketed.state_dict()) == list(decoder.state_dict())
    assert weights_digest(unbucketed) == weights_digest(decoder)
    float32, _, _ = load_model("sage-tiny", device="cpu", batch_invariant="off")
    assert not builds_per_row_count(float32)
    assert not [m for m in float32.modules() if isinstance(m, BucketedLinear)]


def _dense_layers(decoder: Decoder) -> int:
    """The decoder's linear layers: q, k, v, o, gate, up and down per layer, and the lm head."""
    return 7 * decoder.config.num_hidden_layers + 1
