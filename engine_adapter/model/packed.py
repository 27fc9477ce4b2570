"""Linear layers on oneDNN's prepacked weights (CPU, float32 and bfloat16).

A dense ``F.linear`` on the CPU hands the weight to the BLAS as it is stored (``[out, in]``,
read transposed) on every call. oneDNN can reorder a weight once into the blocked layout its
GEMM kernels read (``torch.ops.mkldnn._reorder_linear_weight``) and then multiply against it
(``torch.ops.mkldnn._linear_pointwise``); torch's own inductor does this when it freezes a model
for CPU inference. The decode step of a small model is a few hundred such GEMMs with a handful of
rows each, where the layout and the per-call setup matter most: docs/performance.md has the
figures of this CPU (`benchmarks/decode_profile.py --packed-weights`).

Neither kernel wins everywhere. On this 2-core Xeon (one thread) ``F.linear`` takes 70-170 us for
SmolLM2's shapes at 1 to 3 rows and doubles at 4, where the BLAS changes kernels, while the packed
GEMM costs a steady ~40 us more per call at 1 row and wins from 4 or 6 rows on (1.3-1.7x at 8);
for the small k/v projections (576 x 192) plain stays ahead. So each distinct weight shape is
timed once at load (`crossover`: both kernels on 1 to 32 rows, best of a few runs) and a
`PackedLinear` sends a call with fewer rows than its shape's crossover to ``F.linear`` and the
rest to the packed weight; a shape where packing never wins is not packed. A decode step of a
small batch then keeps the plain path, a larger batch and every prefill take the packed one.

The reorder is done once, at load, on the engine thread. The results equal ``F.linear``'s up to
float rounding (another summation order). The packed weight is a copy kept beside the original
(which the small-batch path reads): packing costs the packed layers' weights once more.

oneDNN builds (JIT-compiles) one primitive per input shape, about 0.5-0.8 MiB each on this CPU, and
keeps up to 1,024 of them in its primitive cache: an engine whose steps bring every row count from
1 to 2,048 (`--max-num-batched-tokens`) would grow by hundreds of MiB with the requests it served
(issue 49). So a packed call's rows are padded with zeros up to `padded_rows` (a small stated set:
exact to 8, then rounded up to three significant bits: 10, 12, 14, 16, 20, 24, 28, 32, 40, ...; at
most a quarter more rows, four sizes per doubling, 40 sizes up to 2,048) and the output sliced
back. A row's output does not depend on the rows beside it in oneDNN's GEMM (what batch invariance
already relies on, `engine_adapter.model.invariance`), so padding changes no bit of a real row
(tests/test_model_packed_rows.py checks every bucket edge); the primitives then number at most 40 per
weight shape to 2,048 rows, whatever the traffic.

Each bucket's primitive is built the first time a step brings it, and with it the activation
buffers reach a new high-water mark: a step in a RSS plot that a soak cannot tell from a leak, hours
into a run (issue 49: 1.5 MiB at 23,000 requests). So the engine's warm-up runs every packed weight
shape once at every bucket a step can reach (`warm_buckets`: to `--max-num-batched-tokens` rows,
the lm head to `--max-num-seqs`, the rows it sees outside ``return_all_logits``), and the
primitives exist before the first request. Its freed activations stay in the allocator's arenas on
purpose: handed back (``malloc_trim``), the traffic regrew the heap in the same steps (a soak FAILED
at 3.6 MiB per 10,000 requests, docs/benchmarks/scripts.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from engine_adapter.model.decoder import Decoder

__all__ = [
    "PACKED_WEIGHTS_CHOICES",
    "EXACT_ROWS",
    "BucketedLinear",
    "PROBE_ROWS",
    "PackedLinear",
    "bucket_plain_linears",
    "builds_per_row_count",
    "check_packed_weights",
    "crossover",
    "pack_decoder",
    "packing_available",
    "padded_rows",
    "row_buckets",
    "warm_buckets",
]

PACKED_WEIGHTS_CHOICES = ("auto", "on", "off")
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# Rows at which `crossover` times the two kernels: decode batches up to 32, then prefill-sized.
PROBE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 128)
# Row counts a packed call keeps as they are (decode batches); larger ones are padded, `padded_rows`.
EXACT_ROWS = 8
_SIGNIFICANT_BITS = 3


def padded_rows(rows: int) -> int:
    """The rows a packed call of `rows` rows runs with: `rows` itself up to `EXACT_ROWS`, else
    `rows` rounded up to three significant bits (at most a quarter more), so that oneDNN builds
    one primitive per bucket, not per row count."""
    if rows <= EXACT_ROWS:
        return rows
    shift = rows.bit_length() - _SIGNIFICANT_BITS
    return -(-rows >> shift) << shift


def packing_available(decoder: Decoder) -> str | None:
    """None when `decoder`'s linears can be packed, else why not (one line)."""
    if decoder.device.type != "cpu":
        return f"packed weights are a CPU layout; the model is on {decoder.device}"
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "packed weights need oneDNN (mkldnn), which this torch build lacks"
    if decoder.dtype not in _PACKABLE_DTYPES:
        return f"packed weights take float32 or bfloat16, not {decoder.dtype}"
    if decoder.dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "oneDNN packs bfloat16 weights only on CPUs with AVX512-BW or AVX-NE-CONVERT"
    return None


def row_buckets(min_rows: int, max_rows: int) -> list[int]:
    """The buckets (`padded_rows`) that calls of `min_rows` to `max_rows` rows run as, ascending."""
    buckets: list[int] = []
    rows = max(min_rows, 1)
    while rows <= max_rows:
        buckets.append(padded_rows(rows))
        rows = buckets[-1] + 1
    return buckets


class PackedLinear(nn.Module):
    """``y = x @ weight.T + bias``: calls of at least `min_rows` rows on the weight reordered once
    into oneDNN's layout, smaller ones through ``F.linear`` on the original weight."""

    weight: torch.Tensor
    packed: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, min_rows: int = 1) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.min_rows = min_rows
        self.register_buffer("weight", linear.weight.detach())
        # No batch-size hint: decode batches and prefills of any length share one packed copy.
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(self.weight, None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        if rows < self.min_rows:
            y = F.linear(flat, self.weight, self.bias)
        else:
            bucket = padded_rows(rows)  # a bounded set of shapes: one oneDNN primitive each
            if bucket != rows:
                flat = _padded(flat, bucket)
            y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")[:rows]
        out: torch.Tensor = y.view(*x.shape[:-1], self.out_features)
        return out


class BucketedLinear(nn.Module):
    """``F.linear`` with its rows padded to `padded_rows`, on the layer's own weight (no copy).

    In bfloat16 and float16 on the CPU, ``F.linear`` is a oneDNN matmul, and oneDNN builds
    (JIT-compiles) one primitive per row count, about half a MiB each, keeping up to 1,024: a plain
    layer in an engine whose steps bring every row count from 1 to 2,048 grew by 70 MiB per
    10,000 requests of SmolLM2 (issue 49), as the packed layers did before their buckets. Padded,
    its calls take at most 40 shapes to 2,048 rows, which the warm-up builds (`warm_buckets`).
    A row's output does not depend on the zero rows below it (the row-independence batch
    invariance already relies on), so padding changes no bit of a real row."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.min_rows = 1  # every call is bucketed (`warm_buckets` reads it as PackedLinear's)
        # the layer's own parameters, under the same names: tied weights stay tied and the
        # state dict (`weights_digest`) is unchanged
        self.weight = linear.weight  # a Parameter: registered as nn.Linear registers it
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        bucket = padded_rows(rows)
        y = F.linear(_padded(flat, bucket) if bucket != rows else flat, self.weight, self.bias)[:rows]
        out: torch.Tensor = y.view(*x.shape[:-1], self.out_features)
        return out


def builds_per_row_count(decoder: Decoder) -> bool:
    """Whether `decoder`'s plain ``F.linear`` is a oneDNN matmul, built per row count: bfloat16
    or float16 on a CPU where oneDNN runs that dtype (float32 takes MKL's GEMM, and a CPU without
    the instructions torch's own kernels, neither of which builds anything per shape)."""
    if decoder.device.type != "cpu" or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    if decoder.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if decoder.dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def bucket_plain_linears(decoder: Decoder) -> int:
    """Replace the dense linear layers still plain (neither packed nor quantized) by
    `BucketedLinear`, in place, where their kernel is built per row count
    (`builds_per_row_count`); returns how many were replaced."""
    if not builds_per_row_count(decoder):
        return 0
    replaced = 0
    for name, module in list(decoder.named_modules()):
        if type(module) is not nn.Linear:
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        if getattr(parent, "calls_one_row", False):  # `invariance.RowByRow`: one row, one shape
            continue
        setattr(parent, attr, BucketedLinear(module))
        replaced += 1
    return replaced


def _padded(flat: torch.Tensor, rows: int) -> torch.Tensor:
    """`flat` followed by zero rows up to `rows` (one copy; cheaper than ``F.pad``)."""
    out = flat.new_empty(rows, flat.shape[1])
    out[: flat.shape[0]].copy_(flat)
    out[flat.shape[0] :].zero_()
    return out


def _best_of(run: Callable[[], object], repeats: int) -> float:
    run()  # the first call sets up the kernel
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def crossover(linear: nn.Linear, repeats: int = 5) -> int | None:
    """The fewest rows (of `PROBE_ROWS`) from which the packed kernel beats ``F.linear`` on every
    larger probe too, or None when it loses at the largest (then the layer is not packed)."""
    weight = linear.weight.detach()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    x = torch.randn(max(PROBE_ROWS), linear.in_features, dtype=weight.dtype)
    wins = []
    for rows in PROBE_ROWS:
        xs = x[:rows]
        plain = _best_of(partial(F.linear, xs, weight), repeats)
        fast = _best_of(
            partial(torch.ops.mkldnn._linear_pointwise, xs, packed, None, "none", [], ""), repeats
        )
        wins.append(fast < plain)
    return first_of_winning_run(PROBE_ROWS, wins)


def first_of_winning_run(probes: tuple[int, ...], wins: list[bool]) -> int | None:
    """The first probe of the run of wins that ends the list (None when the last probe lost): a
    kernel that wins at 4 rows, loses at 6 and wins from 8 on is taken from 8."""
    first = len(wins)
    while first > 0 and wins[first - 1]:
        first -= 1
    return probes[first] if first < len(wins) else None


def check_packed_weights(mode: str) -> None:
    """Raise ValueError when `mode` is not one of `PACKED_WEIGHTS_CHOICES`."""
    if mode not in PACKED_WEIGHTS_CHOICES:
        raise ValueError(f"packed weights {mode!r} is not one of {', '.join(PACKED_WEIGHTS_CHOICES)}")


def pack_decoder(decoder: Decoder, mode: str, min_rows: Callable[[nn.Linear], int | None] = crossover) -> int:
    """Replace the decoder's dense linear layers (those quantization left, and the lm head) by
    `PackedLinear`, in place, each from its shape's crossover.

    Args:
        decoder: A loaded `Decoder`.
        mode: ``off``; ``on`` (raises when the decoder cannot be packed); ``auto`` (packs when it
            can: a CPU decoder in float32 or bfloat16 on a torch with oneDNN).
        min_rows: The rows from which a layer takes the packed kernel, None to leave it plain;
            called once per distinct weight shape (default: timed, `crossover`).

    Returns:
        How many layers were packed.

    Raises:
        ValueError: An unknown mode, or ``on`` for a decoder that cannot be packed (the reason).
    """
    check_packed_weights(mode)
    why_not = packing_available(decoder)
    if mode == "off" or (mode == "auto" and why_not is not None):
        return 0
    if why_not is not None:
        raise ValueError(why_not)
    by_shape: dict[tuple[int, int, bool], int | None] = {}
    packed = dense = 0
    with torch.no_grad():
        for name, module in list(decoder.named_modules()):
            if type(module) is not nn.Linear:  # quantized layers keep their own kernels
                continue
            dense += 1
            shape = (module.out_features, module.in_features, module.bias is not None)
            if shape not in by_shape:
                by_shape[shape] = min_rows(module)
            rows = by_shape[shape]
            if rows is None:
                continue
            parent_name, _, attr = name.rpartition(".")
            parent = decoder.get_submodule(parent_name) if parent_name else decoder
            setattr(parent, attr, PackedLinear(module, rows))
            packed += 1
    decoder.packed_weights = f"{packed} of {dense} linears" if dense else "no"
    return packed


def warm_buckets(decoder: nn.Module, max_rows: int, max_head_rows: int) -> int:
    """Run each packed (or bucketed) weight shape of `decoder` once at every row bucket its calls
    can take, so that oneDNN builds the primitives (and the buffers reach their high-water mark)
    now, not during the requests; layers of one shape share the primitives, so a shape is run once.

    Args:
        decoder: A model whose linears may be `PackedLinear` or `BucketedLinear` (none: nothing
            to do).
        max_rows: The most rows a step brings (the engine's ``max_num_batched_tokens``).
        max_head_rows: The most rows of the ``lm_head`` (one per sequence: ``max_num_seqs``).

    Returns:
        How many (shape, bucket) pairs were run.
    """
    head = getattr(decoder, "lm_head", None)
    done: set[tuple[int, int, bool, torch.dtype, int]] = set()
    with torch.inference_mode():
        for module in decoder.modules():
            if not isinstance(module, (PackedLinear, BucketedLinear)):
                continue
            limit = max_head_rows if module is head else max_rows
            for rows in row_buckets(module.min_rows, limit):
                key = (
                    module.in_features,
                    module.out_features,
                    module.bias is not None,
                    module.weight.dtype,
                    rows,
                )
                if key not in done:
                    done.add(key)
                    module(module.weight.new_zeros(rows, module.in_features))
    return len(done)
