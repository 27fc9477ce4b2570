"""Batch-invariant forward passes: a row's logits never depend on the batch it ran in.

The policy a user picks may change speed and memory, never an answer. A block evicted and
recomputed, a preempted sequence resumed, a prefix served from the cache or a host tier and a
fresh prefill must all give the same bits, and they only do when every reduction a row takes part
in runs in an order fixed by the row itself: not by how many rows share the matmul, how long the
batch's longest context is, or how a prompt was chunked (Thinking Machines, "Defeating
Nondeterminism in LLM Inference", 2025; vLLM's ``VLLM_BATCH_INVARIANT``, SGLang's
``--enable-deterministic-inference``). docs/concepts/exactness.md has the whole account; here:

- **Linear layers** run one kernel for every row count. oneDNN's GEMM on a weight it reordered
  once (`engine_adapter.model.packed`) reduces each row in the same order at 1 row and at 2,000;
  MKL's float32 GEMM does not (a GEMV at 1 row, other kernels at 2-3 and at 4+, and a tail
  kernel for the last rows of a call). Which kernel a layer takes is checked at load by
  `rows_invariant`, which runs a row alone and inside batches of drawn sizes and positions; a
  layer whose every kernel fails runs row by row (`RowByRow`): slow, exact, and said so.
- **Attention** reads each row's own keys from the pool and reduces them in key order
  (`paged_attention`: the compiled kernel, engine_adapter/model/_attention.pyx; `rowwise_attention`
  without a compiler: one SDPA call per row over exactly its keys).
- RMSNorm (one row per reduction, torch's fused kernel), rotary, SiLU and the residual adds are
  per row or per element already; `tests/test_batch_invariance.py` holds the whole forward to it.

`--batch-invariant off` gives the faster kernels back (SDPA over the padded batch, the packed
weights' crossover): outputs may then depend on batching. CUDA has no invariant kernels in sage
yet, so ``auto`` is off there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine_adapter.model.invariant_attention import attention_kernel
from engine_adapter.model.packed import PackedLinear, packing_available

if TYPE_CHECKING:
    from engine_adapter.model.decoder import Decoder

__all__ = [
    "BATCH_INVARIANT_CHOICES",
    "RowByRow",
    "make_invariant",
    "resolve_batch_invariant",
    "rows_invariant",
]

BATCH_INVARIANT_CHOICES = ("auto", "on", "off")

# Row counts `rows_invariant` runs a probe row in: one row, the small counts where BLAS kernels
# change, tails of vector widths, and prefill-sized calls.
PROBE_ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 33, 64, 130)


def resolve_batch_invariant(mode: str, device: torch.device | str) -> bool:
    """Whether the forward runs batch-invariant: ``on``, ``off``, or ``auto`` (on the CPU).

    Raises:
        ValueError: An unknown mode, or ``on`` on a device sage has no invariant kernels for.
    """
    if mode not in BATCH_INVARIANT_CHOICES:
        raise ValueError(f"batch invariance {mode!r} is not one of {', '.join(BATCH_INVARIANT_CHOICES)}")
    cpu = torch.device(device).type == "cpu"
    if mode == "on" and not cpu:
        raise ValueError(
            f"--batch-invariant on needs the CPU: sage has no batch-invariant kernels for {device} "
            "(use --batch-invariant off there; outputs may then depend on batching)"
        )
    return mode == "on" or (mode == "auto" and cpu)


def rows_invariant(
    linear: Callable[[torch.Tensor], torch.Tensor], in_features: int, dtype: torch.dtype
) -> bool:
    """Whether `linear` gives every row the same bits alone and inside larger calls.

    A probe, not a proof: a call of every count of `PROBE_ROWS` (drawn rows, a fixed seed, so a
    load is reproducible), each of its rows held to that row run alone. Every row, not one: oneDNN's
    bfloat16 GEMM with 1,536 inputs (SmolLM2's down projection, on a CPU with native bf16) gives
    most rows of a batch their lone bits and a few others not, which a single probed row missed
    (issue 49's soak machine: SmolLM2's answers then depended on the batch).
    """
    generator = torch.Generator().manual_seed(0)
    for rows in PROBE_ROWS:
        batch = torch.randn(rows, in_features, generator=generator).to(dtype)
        together = linear(batch)
        for at in range(rows):
            if not torch.equal(together[at], linear(batch[at : at + 1])[0]):
                return False
    return True


class RowByRow(nn.Module):
    """A linear layer called one row at a time: invariant by construction (every call has one
    row), and slow; the layer of last resort when no kernel passes `rows_invariant`."""

    calls_one_row = True  # so its inner layer is not bucketed (`packed.bucket_plain_linears`)

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        rows = [self.inner(flat[i : i + 1]) for i in range(flat.shape[0])]
        out = torch.cat(rows) if rows else self.inner(flat)
        return out.view(*x.shape[:-1], out.shape[-1])


def _in_features(module: nn.Module) -> int:
    value = getattr(module, "in_features", None)
    if not isinstance(value, int):
        raise TypeError(f"{type(module).__name__} has no in_features")
    return value


def make_invariant(decoder: Decoder, prefer_packed: bool) -> str:
    """Make every linear layer of `decoder` batch-invariant, in place, and turn on its invariant
    attention (`Decoder.batch_invariant`).

    Dense layers take oneDNN's packed weight (one kernel at every row count) when `prefer_packed`
    or when plain ``F.linear`` fails `rows_invariant`; quantized layers keep their kernels when
    they pass. A layer that fails with every kernel runs `RowByRow`. Probed once per kind and
    shape of layer.

    Returns:
        What the linears run, for the engine's info (e.g. ``packed 211, plain 0, row-by-row 0``).
    """

    can_pack = packing_available(decoder) is None
    chosen: dict[tuple[str, int, int, bool], str] = {}
    counts = {"packed": 0, "plain": 0, "quantized": 0, "row-by-row": 0}
    with torch.no_grad():
        for name, module in list(decoder.named_modules()):
            replacement, kind = _invariant_layer(module, decoder.dtype, can_pack, prefer_packed, chosen)
            if kind is None:
                continue
            counts[kind] += 1
            if replacement is not module:
                parent_name, _, attr = name.rpartition(".")
                setattr(decoder.get_submodule(parent_name) if parent_name else decoder, attr, replacement)
    linears = ", ".join(f"{kind} {n}" for kind, n in counts.items() if n)
    decoder.batch_invariant = True
    decoder.invariant_kernels = f"linears: {linears}; attention: {attention_kernel()}"
    if counts["packed"]:
        decoder.packed_weights = f"{counts['packed']} of {sum(counts.values())} linears"
    return decoder.invariant_kernels


def _invariant_layer(
    module: nn.Module,
    dtype: torch.dtype,
    can_pack: bool,
    prefer_packed: bool,
    chosen: dict[tuple[str, int, int, bool], str],
) -> tuple[nn.Module, str | None]:
    """The invariant stand-in for one module and its kind (None: not a linear layer)."""
    if not hasattr(module, "in_features") or isinstance(module, (RowByRow, PackedLinear)):
        return module, None
    dense = type(module) is nn.Linear
    out_features = int(getattr(module, "out_features", 0))
    key = (
        type(module).__name__,
        _in_features(module),
        out_features,
        getattr(module, "bias", None) is not None,
    )
    if key not in chosen:
        chosen[key] = _probe_kinds(module, dtype, dense and can_pack, prefer_packed)
    kind = chosen[key]
    if kind == "packed":
        assert isinstance(module, nn.Linear)
        return PackedLinear(module, min_rows=0), kind
    if kind == "row-by-row":
        return RowByRow(module), kind
    return module, kind


def _probe_kinds(module: nn.Module, dtype: torch.dtype, can_pack: bool, prefer_packed: bool) -> str:
    """The first kernel of the preferred order that passes `rows_invariant` for this layer."""
    plain = "plain" if type(module) is nn.Linear else "quantized"
    order = ["packed", plain] if prefer_packed else [plain, "packed"]
    for kind in order:
        if kind == "packed" and not can_pack:
            continue
        assert isinstance(module, nn.Linear) or kind != "packed"
        layer = PackedLinear(module, min_rows=0) if kind == "packed" else module  # type: ignore[arg-type]
        if rows_invariant(layer, _in_features(module), dtype):
            return kind
    return "row-by-row"
