"""The run dtype of the model and of its KV pool: ``auto`` and the names the engine accepts.

``auto`` is bfloat16 where a bf16 matmul runs at full speed: on CUDA, and on a CPU whose flags
(``/proc/cpuinfo``) show ``amx_bf16`` or ``avx512_bf16``. Elsewhere bfloat16 is emulated through
float32 and slower than float32 itself, so auto stays float32 there.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from engine_adapter.model.kv_pool import resolve_device, resolve_dtype

__all__ = [
    "DTYPE_CHOICES",
    "QUANTIZATION_CHOICES",
    "auto_dtype",
    "cpu_flags",
    "dtype_name",
    "has_native_bf16",
    "run_dtype",
]

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATION_CHOICES = ("none", "int8", "int4")
_NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first processor in `cpuinfo` (empty where the file is absent)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def has_native_bf16(flags: Iterable[str]) -> bool:
    """Whether a CPU with these flags multiplies bf16 natively (AMX or AVX512-BF16)."""
    return not _NATIVE_BF16_FLAGS.isdisjoint(flags)


def auto_dtype(device: str | torch.device, flags: Iterable[str] | None = None) -> torch.dtype:
    """bfloat16 on CUDA or on a CPU with native bf16 (`flags`, else this machine's), else float32."""
    if resolve_device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if has_native_bf16(cpu_flags() if flags is None else flags) else torch.float32


def run_dtype(name: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """The dtype `name` stands for on `device`: ``auto`` (or None) per `auto_dtype`, else the name.

    Raises:
        ValueError: Not ``auto`` and not a dtype name.
    """
    if name is None or (isinstance(name, str) and name.strip().lower() == "auto"):
        return auto_dtype(device)
    return resolve_dtype(name)


def dtype_name(dtype: torch.dtype) -> str:
    """``float32``, ``bfloat16`` ...: the name without ``torch.``."""
    return str(dtype).removeprefix("torch.")
