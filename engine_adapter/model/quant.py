"""Weight-only quantization of the decoder's linear layers, on torch's own CPU kernels.

- ``int8``: one symmetric scale per output channel, ``torch.ops.aten._weight_int8pack_mm``.
- ``int4``: groups of 32 input values with a scale and a minimum each (``w = q * scale + min``,
  q in 0..15: the layout of llama.cpp's Q4_1), ``torch.ops.aten._weight_int4pack_mm_for_cpu``
  on the weights packed by ``_convert_weight_to_int4pack_for_cpu``. The kernel computes
  ``(q - 8) * scale + zero``, so ``zero = min + 8 * scale``.

The kernels run on bfloat16 activations whatever the model's dtype: torch 2.13's CPU kernels are
vectorised for bfloat16 only, and with float32 or float16 activations they took 35-60x the time
of a dense float32 matmul (SmolLM2's MLP shape, one thread, AVX512 without BF16). So a quantized
linear casts its input to bfloat16 and its output back; scales and zeros are bfloat16 (a GGUF's
float16 scales and minima are rounded to bfloat16; its 4-bit codes are kept as they are).
A linear whose shape torch's int4 packing refuses (`int4_fits`) stays int8. The lm head is int8
in both modes: the logits decide every token and int4 there costs agreement
for little speed (llama.cpp keeps its output layer at 8 bits for the same reason).

A GGUF whose linear weights are Q4_1 gives `Int4Linear.from_groups` its codes, scales and minima
as stored: the int4 model then runs the file's own weights, not a re-quantization of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine_adapter.model.decoder import Decoder

# The activation dtype of torch's fast CPU weight-only kernels (see above).
KERNEL_DTYPE = torch.bfloat16

__all__ = [
    "GROUP_SIZE",
    "KERNEL_DTYPE",
    "Int4Linear",
    "Int8Linear",
    "Q4Groups",
    "int4_fits",
    "quantize_decoder",
]

GROUP_SIZE = 32
# The CPU packing's tile parameter; the CPU kernel accepts any value the CUDA one does.
_INNER_K_TILES = 2


@dataclass(frozen=True, slots=True)
class Q4Groups:
    """An int4 weight as groups of `GROUP_SIZE` along the input dimension.

    Attributes:
        codes: uint8 ``[out, in]``, each 0..15.
        scales: ``[out, in // GROUP_SIZE]`` float.
        minima: ``[out, in // GROUP_SIZE]`` float: the value of code 0.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    minima: torch.Tensor

    def dequantized(self) -> torch.Tensor:
        """The float32 weight these groups stand for, ``[out, in]`` (the tests' reference)."""
        out, k = self.codes.shape
        grouped = self.codes.view(out, k // GROUP_SIZE, GROUP_SIZE).float()
        weight = grouped * self.scales.float()[..., None] + self.minima.float()[..., None]
        return weight.view(out, k)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q4Groups:
        """Round `weight` ``[out, in]`` to 16 levels between each group's minimum and maximum."""
        out, k = weight.shape
        grouped = weight.detach().float().view(out, k // GROUP_SIZE, GROUP_SIZE)
        low, high = grouped.amin(-1), grouped.amax(-1)
        # A constant group has no range: any positive scale keeps its value exactly at code 0.
        scales = torch.where(high > low, (high - low) / 15, torch.ones_like(low))
        codes = torch.round((grouped - low[..., None]) / scales[..., None]).clamp(0, 15)
        return cls(codes.to(torch.uint8).view(out, k), scales, low)


def int4_fits(out_features: int, in_features: int) -> bool:
    """Whether torch's int4 packing takes this shape: outputs a multiple of 16, inputs of 32.
    A linear that does not fit stays int8 under ``int4``."""
    return out_features % 16 == 0 and in_features % GROUP_SIZE == 0


def _check_cpu(weight: torch.Tensor) -> None:
    if weight.device.type != "cpu":
        raise ValueError(
            f"weight-only quantization runs on torch's CPU kernels; the model is on {weight.device} "
            "(use --quantization none and --dtype bfloat16 there)"
        )


class Int8Linear(nn.Module):
    """``y = x @ (q * scale).T + bias`` with q int8 ``[out, in]`` and one scale per output row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        _check_cpu(weight)
        w = weight.detach().float()
        # Round against the scale the kernel will use (bfloat16), not its float32 value: then every
        # weight is within half a step of its code.
        scales = (w.abs().amax(dim=1).clamp(min=1e-30) / 127).to(KERNEL_DTYPE)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        codes = torch.round(w / scales.float()[:, None]).clamp(-127, 127)
        self.register_buffer("qweight", codes.to(torch.int8))
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        out: torch.Tensor = y.view(*x.shape[:-1], self.out_features)
        return out


class Int4Linear(nn.Module):
    """``y = x @ w.T + bias`` with w in int4 groups of `GROUP_SIZE` (see `Q4Groups`)."""

    def __init__(self, groups: Q4Groups, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        _check_cpu(groups.codes)
        out, k = groups.codes.shape
        if not int4_fits(out, k):
            raise ValueError(f"int4 packs [out, in] with out a multiple of 16 and in of 32, not {[out, k]}")
        self.in_features, self.out_features = k, out
        codes = groups.codes.to(torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INNER_K_TILES)
        scales, minima = groups.scales.float(), groups.minima.float()
        # [in // 32, out, 2]: (scale, zero) with the kernel's zero = min + 8 * scale
        scales_zeros = torch.stack((scales.T, (minima + 8 * scales).T), dim=-1).contiguous()
        self.register_buffer("packed", packed)
        self.register_buffer("scales_zeros", scales_zeros.to(KERNEL_DTYPE))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(KERNEL_DTYPE).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP_SIZE, self.scales_zeros)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        out: torch.Tensor = y.view(*x.shape[:-1], self.out_features)
        return out


_LAYER_LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def quantize_decoder(decoder: Decoder, mode: str, groups: dict[str, Q4Groups] | None = None) -> int:
    """Replace the linear layers of `decoder` (layers and lm head) by quantized ones, in place.

    Args:
        decoder: A `Decoder`, on the CPU.
        mode: ``none`` (nothing changes), ``int8`` or ``int4``.
        groups: For ``int4``, the weights already in int4 groups by module name
            (``layers.0.mlp.up_proj``): used as they are instead of quantizing the float weight.

    Returns:
        How many linear layers took weights from `groups`.

    Raises:
        ValueError: An unknown mode, or the decoder is not on the CPU.
    """
    if mode not in ("none", "int8", "int4"):
        raise ValueError(f"quantization {mode!r} is not one of none, int8, int4")
    if mode == "none":
        return 0
    dtype = decoder.dtype
    taken = 0
    for name, module in list(decoder.named_modules()):
        if not any(name.endswith(suffix) for suffix in _LAYER_LINEARS):
            continue
        assert isinstance(module, nn.Linear)
        replacement: nn.Module
        if mode == "int8" or not int4_fits(module.out_features, module.in_features):
            replacement = Int8Linear(module.weight, module.bias, dtype)
        else:
            given = (groups or {}).get(name)
            taken += given is not None
            q4 = given if given is not None else Q4Groups.quantize(module.weight)
            replacement = Int4Linear(q4, module.bias, dtype)
        parent_name, _, attr = name.rpartition(".")
        setattr(decoder.get_submodule(parent_name), attr, replacement)
    head = decoder.lm_head
    assert isinstance(head, nn.Linear)
    decoder.lm_head = Int8Linear(head.weight, head.bias, dtype)
    decoder.quantization = mode
    return taken
