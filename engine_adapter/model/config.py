"""The shape of a Llama/Qwen2-family decoder, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch

__all__ = ["SAGE_TINY", "SUPPORTED_ARCHITECTURES", "ModelConfig"]

Architecture = Literal["llama", "qwen2"]

SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2")

# `architectures[0]` of config.json, for the rare config without a `model_type`.
_ARCHITECTURE_CLASSES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}

_ROPE_TYPES = ("default", "linear", "llama3")

_CHECKPOINT_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class ModelConfig:
    """The hyperparameters a `Decoder` is built from.

    Attributes:
        architecture: ``"llama"`` or ``"qwen2"``.
        vocab_size: Rows of the embedding and of the lm head.
        hidden_size: Width of the residual stream.
        intermediate_size: Width of the SwiGLU MLP.
        num_hidden_layers: Decoder layers.
        num_attention_heads: Query heads.
        num_key_value_heads: Key/value heads (grouped-query attention when fewer than query heads).
        head_dim: Size of one head.
        rms_norm_eps: Epsilon of every RMSNorm.
        rope_theta: Base of the rotary embedding frequencies.
        max_position_embeddings: Longest context the model was trained for.
        tie_word_embeddings: The lm head shares the embedding matrix.
        attention_bias: q/k/v projections have a bias (always for Qwen2; Llama's ``attention_bias``).
        attention_out_bias: The output projection has a bias (Llama's ``attention_bias``; never Qwen2).
        mlp_bias: The MLP projections have biases (Llama's ``mlp_bias``).
        rope_scaling: ``None`` or the rope parameters of a ``"linear"`` or ``"llama3"`` scaling.
        dtype: The dtype the checkpoint was stored in (``torch_dtype``); the loader's dtype decides
            the one the model runs in.
        bos_token_id: Beginning-of-sequence id from the config, if any.
        eos_token_id: End-of-sequence id from the config, if any.
    """

    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: Mapping[str, Any] | None = None
    dtype: torch.dtype = torch.float32
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {self.architecture!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ValueError(f"rms_norm_eps={self.rms_norm_eps!r} must be a positive number")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise ValueError(f"rope_theta={self.rope_theta!r} must be a positive number")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)

    @property
    def num_query_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf_config(cls, hf_config: Mapping[str, Any]) -> ModelConfig:
        """Read the dict of a Hugging Face ``config.json`` (transformers 4.x or 5.x layout).

        Raises:
            ValueError: The architecture is not Llama or Qwen2, a feature this decoder does not
                implement is switched on (sliding-window attention, a rope scaling other than
                linear/llama3, an activation other than SiLU), or a field is missing or ill-typed.
                The message names the field and its value.
        """
        architecture = _architecture(hf_config)

        def required(key: str) -> Any:
            if key not in hf_config or hf_config[key] is None:
                raise ValueError(f"config.json has no {key!r}, which a {architecture} model needs")
            return hf_config[key]

        hidden_size = _as_int("hidden_size", required("hidden_size"))
        num_heads = _as_int("num_attention_heads", required("num_attention_heads"))
        num_kv_heads = _as_int("num_key_value_heads", hf_config.get("num_key_value_heads") or num_heads)
        head_dim = hf_config.get("head_dim") or (hidden_size // num_heads if num_heads else 0)

        activation = hf_config.get("hidden_act", "silu")
        if activation != "silu":
            raise ValueError(f"hidden_act={activation!r} is not supported (only 'silu')")
        if architecture == "qwen2":
            if hf_config.get("use_sliding_window"):
                raise ValueError("use_sliding_window=true is not supported (full attention only)")
            layer_types = hf_config.get("layer_types") or []
            windowed = sorted({t for t in layer_types if t != "full_attention"})
            if windowed:
                raise ValueError(f"layer_types {windowed} are not supported (full attention only)")

        rope_theta, rope_scaling = _rope(hf_config)
        attention_bias = bool(hf_config.get("attention_bias", False))
        return cls(
            architecture=architecture,
            vocab_size=_as_int("vocab_size", required("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=_as_int("intermediate_size", required("intermediate_size")),
            num_hidden_layers=_as_int("num_hidden_layers", required("num_hidden_layers")),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=_as_int("head_dim", head_dim),
            rms_norm_eps=_as_float("rms_norm_eps", hf_config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=_as_int(
                "max_position_embeddings", hf_config.get("max_position_embeddings", 4096)
            ),
            tie_word_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and never an output bias; Llama's one flag sets both.
            attention_bias=True if architecture == "qwen2" else attention_bias,
            attention_out_bias=False if architecture == "qwen2" else attention_bias,
            mlp_bias=bool(hf_config.get("mlp_bias", False)) if architecture == "llama" else False,
            rope_scaling=rope_scaling,
            dtype=_CHECKPOINT_DTYPES.get(
                str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32"), torch.float32
            ),
            bos_token_id=_first_id(hf_config.get("bos_token_id")),
            eos_token_id=_first_id(hf_config.get("eos_token_id")),
        )


def _architecture(hf_config: Mapping[str, Any]) -> Architecture:
    model_type = hf_config.get("model_type")
    if model_type is None:
        classes = hf_config.get("architectures") or []
        model_type = next((_ARCHITECTURE_CLASSES[c] for c in classes if c in _ARCHITECTURE_CLASSES), None)
        if model_type is None:
            raise ValueError(
                f"config.json has no 'model_type' and architectures={classes!r} names no supported "
                f"model (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"model_type={model_type!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return cast(Architecture, model_type)


def _rope(hf_config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers 5's ``rope_parameters`` or 4's two keys."""
    params = hf_config.get("rope_parameters")
    if isinstance(params, Mapping) and params:
        params = dict(params)
        theta = params.pop("rope_theta", hf_config.get("rope_theta", 10000.0))
    else:
        theta = hf_config.get("rope_theta", 10000.0)
        params = dict(hf_config.get("rope_scaling") or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    theta = _as_float("rope_theta", theta)
    if rope_type == "default":
        return theta, None
    scaling = {"rope_type": rope_type, **params}
    _check_rope_scaling(scaling)
    return theta, scaling


def _check_rope_scaling(scaling: Mapping[str, Any]) -> None:
    rope_type = scaling.get("rope_type")
    if rope_type not in _ROPE_TYPES or rope_type == "default":
        raise ValueError(f"rope scaling {rope_type!r} is not supported (supported: linear, llama3)")
    needed = (
        ("factor",)
        if rope_type == "linear"
        else (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        )
    )
    for key in needed:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"rope scaling {rope_type!r} needs a positive {key!r}, got {value!r}")
    if rope_type == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(
            f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
            f"{scaling['high_freq_factor']!r} <= {scaling['low_freq_factor']!r}"
        )


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an int")
    return value


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}={value!r} must be a number")
    return float(value)


def _first_id(value: Any) -> int | None:
    """A token id from an int or the first of a list (generation configs list several eos ids)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# The built-in model: random weights, a byte tokenizer (ids 0..255 are bytes, then bos, eos and
# pad; the vocab is rounded up to a multiple of 8), sized so that two CPU cores decode a batch of
# 8 at interactive speed. See `engine_adapter.model.loader.load_model("sage-tiny")`.
SAGE_TINY = ModelConfig(
    architecture="llama",
    vocab_size=264,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
    bos_token_id=256,
    eos_token_id=257,
)
