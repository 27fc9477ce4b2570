"""Read a GGUF file (llama.cpp's format): its metadata, its tensors dequantized, its tokenizer.

What a GGUF holds and how it maps onto this package:

- metadata keys ``<arch>.*`` (``llama.block_count``, ``llama.attention.head_count_kv`` ...) become
  the dict of a Hugging Face ``config.json`` (`hf_config`), so `ModelConfig.from_hf_config`
  checks them exactly as it checks a folder's config;
- tensors named ``blk.N.attn_q.weight`` ... become the decoder's parameter names (`parameter_name`),
  dequantized once by the `gguf` package from whatever type the file stores (F32, F16, BF16,
  Q8_0, Q4_0, Q4_1, Q5_x, the K-quants ...) into float32;
- llama.cpp's converter permutes the rows of a llama model's Q and K projections (it stores the
  rotary halves interleaved, as llama.cpp's rope wants them): `unpermute_qk` undoes that, since
  this decoder applies rope on the HF layout (first half, second half). Qwen2 files are stored
  unpermuted (llama.cpp runs their rope in the NeoX layout);
- ``tokenizer.ggml.*`` becomes a `tokenizers` object (`build_tokenizer`): the byte-level BPE kind
  (``gpt2``) from its vocabulary and merges, with the control tokens as special tokens; the chat
  template is ``tokenizer.chat_template``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "GGUFContents",
    "GGUFFormatError",
    "build_tokenizer",
    "dequantized_tensors",
    "hf_config",
    "q4_1_codes",
    "parameter_name",
    "read_gguf",
    "unpermute_qk",
]

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL = 3
_USER_DEFINED = 4

_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
_TOP_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}

# How text is split before byte-level BPE, per `tokenizer.ggml.pre`. Files whose vocabulary was
# learnt on GPT-2's split (gpt2, smollm, ...) take ByteLevel's own regex (None here).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


class GGUFFormatError(ValueError):
    """A GGUF file this package cannot serve: another architecture, tensor type or tokenizer kind."""


@dataclass(frozen=True, slots=True)
class GGUFContents:
    """What `read_gguf` found: the metadata as plain values and the reader for the tensors."""

    path: Path
    metadata: dict[str, Any]
    reader: Any  # gguf.GGUFReader

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_names(self) -> list[str]:
        return [t.name for t in self.reader.tensors]

    @property
    def chat_template(self) -> str | None:
        template = self.metadata.get("tokenizer.chat_template")
        return template if isinstance(template, str) and template else None


def read_gguf(path: Path) -> GGUFContents:
    """Open a GGUF file (memory-mapped: tensors are read when dequantized).

    Raises:
        GGUFFormatError: The file is not a GGUF file the `gguf` package can read.
    """
    from gguf import GGUFReader

    class _PlainArrayReader(GGUFReader):
        # GGUFReader slices its np.memmap once per metadata item; every slice of a memmap pays
        # for memmap's __array_finalize__, which made reading SmolLM2's 49k-token vocabulary
        # take 5.6 s. A plain ndarray view of the same mapping reads it in about 2 s.
        @property
        def data(self) -> Any:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = value.view(np.ndarray)

    try:
        reader = _PlainArrayReader(str(path))
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise GGUFFormatError(f"not a readable GGUF file: {exc}") from exc
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        metadata[key] = field.contents()
    return GGUFContents(path=path, metadata=metadata, reader=reader)


def hf_config(contents: GGUFContents) -> dict[str, Any]:
    """The metadata as the dict of a Hugging Face ``config.json``.

    Raises:
        GGUFFormatError: The architecture is not llama or qwen2, or a key it needs is missing,
            or the file uses a rope variant this decoder does not run.
    """
    arch = contents.architecture
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise GGUFFormatError(
            f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
        )
    meta = contents.metadata

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFFormatError(f"metadata has no {arch}.{name}")
        return value

    names = set(contents.tensor_names)
    if "rope_freqs.weight" in names:
        raise GGUFFormatError(
            "per-frequency rope factors (rope_freqs.weight, llama3-style scaling) are not supported"
        )
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    config: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "vocab_size": int(meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise GGUFFormatError(f"rope scaling {scaling!r} is not supported")
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    return config


def parameter_name(gguf_name: str) -> str | None:
    """The decoder's name for a GGUF tensor, or None for one the decoder has no place for."""
    top = _TOP_NAMES.get(gguf_name)
    if top is not None:
        return top
    match = _LAYER_TENSOR.match(gguf_name)
    if match is None:
        return None
    inner = _LAYER_NAMES.get(match.group(2))
    return None if inner is None else f"layers.{match.group(1)}.{inner}"


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a llama Q or K projection (weight or bias).

    The converter reshapes the rows of each head as (2, head_dim / 2) and swaps the two axes, so
    that the two rotary halves alternate; this reshapes them as (head_dim / 2, 2) and swaps back.
    """
    rows = weight.shape[0]
    tail = weight.shape[1:]
    return weight.reshape(num_heads, rows // num_heads // 2, 2, *tail).swapaxes(1, 2).reshape(weight.shape)


def dequantized_tensors(contents: GGUFContents) -> Iterator[tuple[str, np.ndarray]]:
    """Each tensor's name and its values as float32, in the shape a torch module stores it.

    Raises:
        GGUFFormatError: A tensor's type is one the `gguf` package cannot dequantize.
    """
    from gguf.quants import dequantize

    for tensor in contents.reader.tensors:
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise GGUFFormatError(
                f"tensor {tensor.name} has type {tensor.tensor_type.name}, "
                f"which cannot be dequantized ({exc})"
            ) from exc
        values = np.asarray(values, dtype=np.float32)
        if not values.flags.writeable:  # F32 tensors come straight from the read-only mapping
            values = values.copy()
        yield tensor.name, values


def build_tokenizer(contents: GGUFContents) -> Any:
    """A `tokenizers.Tokenizer` from ``tokenizer.ggml.*`` (it adds a bos token where the file says).

    Raises:
        GGUFFormatError: The tokenizer kind is not byte-level BPE (``gpt2``).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers import Regex as SplitRegex

    meta = contents.metadata
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFFormatError(f"tokenizer kind {kind!r} is not supported (supported: 'gpt2', byte-level BPE)")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = _PRE_TOKENIZER_SPLITS.get(str(meta.get("tokenizer.ggml.pre")))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(SplitRegex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    # Control tokens (<|im_start|> ...) stay whole and are special (left out of decoded text);
    # user-defined ones stay whole and are text.
    kinds = dict(zip(tokens, types, strict=False))  # a file may give no types: no added tokens
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in tokens if kinds.get(t) == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t in tokens if kinds.get(t) == _USER_DEFINED]
    )
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        bos_token = tokens[int(bos)]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A $B", special_tokens=[(bos_token, int(bos))]
        )
    return tokenizer


def q4_1_codes(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A Q4_1 tensor's codes, scales and minima as stored, or None for another type.

    Q4_1 keeps 32 values per block as ``d`` (float16), ``m`` (float16) and 16 bytes of nibbles:
    value j is ``d * q_j + m``, ``q_j`` the low nibble of byte j for j < 16 and the high nibble of
    byte j - 16 otherwise (llama.cpp's block_q4_1).

    Returns:
        ``(codes uint8 [rows, cols], scales float16 [rows, cols // 32], minima float16 [...])``.
    """
    from gguf import GGMLQuantizationType

    if tensor.tensor_type != GGMLQuantizationType.Q4_1:
        return None
    raw = np.asarray(tensor.data, dtype=np.uint8)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 20)
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    minima = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    codes = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1).reshape(rows, -1)
    return codes, scales, minima
