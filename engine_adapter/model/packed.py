"""Linear layers on oneDNN's prepacked weights (CPU, float32 and bfloat16).

A dense ``F.linear`` on the CPU hands the weight to the BLAS as it is stored (``[out, in]``,
read transposed) on every call. oneDNN can reorder a weight once into the blocked layout its
GEMM kernels read (``torch.ops.mkldnn._reorder_linear_weight``) and then multiply against it
(``torch.ops.mkldnn._linear_pointwise``); torch's own inductor does this when it freezes a model
for CPU inference. The decode step of a small model is a few hundred such GEMMs with a handful of
rows each, where the layout and the per-call setup matter most: docs/performance.md has the
figures of this CPU (`benchmarks/decode_profile.py --packed-weights`).

The reorder is done once, at load, on the engine thread. The results equal ``F.linear``'s up to
float rounding (another summation order). The packed weight is a copy: for a model whose lm head
shares the embedding's weight (SmolLM2), the head's copy costs its size again.
"""

from __future__ import annotations

import torch
from torch import nn

from engine_adapter.model.decoder import Decoder

__all__ = ["PackedLinear", "PACKED_WEIGHTS_CHOICES", "pack_decoder", "packing_available"]

PACKED_WEIGHTS_CHOICES = ("auto", "on", "off")
_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_available(decoder: Decoder) -> str | None:
    """None when `decoder`'s linears can be packed, else why not (one line)."""
    if decoder.device.type != "cpu":
        return f"packed weights are a CPU layout; the model is on {decoder.device}"
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "packed weights need oneDNN (mkldnn), which this torch build lacks"
    if decoder.dtype not in _PACKABLE_DTYPES:
        return f"packed weights take float32 or bfloat16, not {decoder.dtype}"
    return None


class PackedLinear(nn.Module):
    """``y = x @ weight.T + bias`` on a weight reordered once into oneDNN's layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # No batch-size hint: decode batches and prefills of any length share one packed copy.
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        out: torch.Tensor = y.view(*x.shape[:-1], self.out_features)
        return out


def pack_decoder(decoder: Decoder, mode: str) -> int:
    """Replace the decoder's dense linear layers (those quantization left, and the lm head) by
    `PackedLinear`, in place.

    Args:
        decoder: A loaded `Decoder`.
        mode: ``off``; ``on`` (raises when the decoder cannot be packed); ``auto`` (packs when it
            can: a CPU decoder in float32 or bfloat16 on a torch with oneDNN).

    Returns:
        How many layers were packed.

    Raises:
        ValueError: An unknown mode, or ``on`` for a decoder that cannot be packed (the reason).
    """
    if mode not in PACKED_WEIGHTS_CHOICES:
        raise ValueError(f"packed weights {mode!r} is not one of {', '.join(PACKED_WEIGHTS_CHOICES)}")
    why_not = packing_available(decoder)
    if mode == "off" or (mode == "auto" and why_not is not None):
        return 0
    if why_not is not None:
        raise ValueError(why_not)
    packed = 0
    for name, module in list(decoder.named_modules()):
        if type(module) is not nn.Linear:  # quantized layers keep their own kernels
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = decoder.get_submodule(parent_name) if parent_name else decoder
        setattr(parent, attr, PackedLinear(module))
        packed += 1
    decoder.packed_weights = packed > 0
    return packed
