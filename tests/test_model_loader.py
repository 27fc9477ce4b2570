"""Loading: folders, the local hub cache (never the network), clear errors; configs; tokenizers."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine_adapter.model import (
    ByteTokenizer,
    Decoder,
    HFTokenizer,
    IncrementalDetokenizer,
    ModelConfig,
    ModelLoadError,
    load_model,
)
from engine_adapter.model.loader import find_in_hf_cache, hf_cache_dirs, weights_digest

HUB_ID = "Qwen/Qwen2.5-7B-Instruct"

TINY_HF_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "eos_token_id": 2,
}


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {chr(ord("a") + i): 3 + i for i in range(26)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))


def _write_checkpoint(folder: Path, hf_config: dict[str, Any] = TINY_HF_CONFIG) -> Decoder:
    """A random checkpoint in Hugging Face layout (``model.`` names), written without transformers."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config))
    torch.manual_seed(0)
    decoder = Decoder(ModelConfig.from_hf_config(hf_config))
    tensors = {f"model.{name}": t.contiguous() for name, t in decoder.state_dict().items()}
    lm_head = tensors.pop("model.lm_head.weight")
    if not decoder.config.tie_word_embeddings:  # a tied checkpoint stores the matrix once
        tensors["lm_head.weight"] = lm_head
    save_file(tensors, str(folder / "model.safetensors"))
    _write_tokenizer(folder)
    return decoder


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache that every lookup uses, and no network."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the loader tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return cache


# ---- the hub cache -----------------------------------------------------------------------------


def test_hub_id_not_in_the_cache_is_a_clear_error(isolated_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        load_model(HUB_ID, device="cpu")
    message = str(caught.value)
    assert "not in the local Hugging Face cache" in message
    assert "never downloads" in message
    assert str(isolated_cache / "models--Qwen--Qwen2.5-7B-Instruct") in message
    assert str(tmp_path / "home" / ".cache" / "huggingface" / "hub") in message
    assert "local folder" in message and "config.json" in message


def test_cache_dirs_follow_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hf_cache_dirs() == [tmp_path / "hf" / "hub", tmp_path / "home" / ".cache" / "huggingface" / "hub"]


def test_hub_id_in_the_cache_loads_the_snapshot_refs_main_names(isolated_cache: Path) -> None:
    repo = isolated_cache / "models--Qwen--Qwen2.5-7B-Instruct"
    _write_checkpoint(repo / "snapshots" / "old")
    expected = _write_checkpoint(repo / "snapshots" / "abc123", {**TINY_HF_CONFIG, "num_hidden_layers": 1})
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    assert find_in_hf_cache(HUB_ID) == repo / "snapshots" / "abc123"

    decoder, tokenizer, config = load_model(HUB_ID, device="cpu")
    assert config.num_hidden_layers == 1
    assert isinstance(tokenizer, HFTokenizer)
    assert weights_digest(decoder) == weights_digest(expected)


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ModelLoadError, match="not a built-in model"):
        load_model("no such model", device="cpu")


# ---- folders -----------------------------------------------------------------------------------------


def test_folder_round_trips_the_weights(tmp_path: Path) -> None:
    expected = _write_checkpoint(tmp_path / "m")
    decoder, tokenizer, config = load_model(str(tmp_path / "m"), device="cpu")
    assert config.architecture == "qwen2" and config.attention_bias and not config.attention_out_bias
    assert weights_digest(decoder) == weights_digest(expected)
    assert tokenizer.eos_token_id == 2
    assert tokenizer.encode("a b z") == [3, 4, 28]


def test_tied_checkpoint_without_lm_head_loads(tmp_path: Path) -> None:
    folder = tmp_path / "tied"
    _write_checkpoint(folder, {**TINY_HF_CONFIG, "tie_word_embeddings": True})
    decoder, _, _ = load_model(str(folder), device="cpu")
    assert decoder.lm_head.weight is decoder.embed_tokens.weight


@pytest.mark.parametrize(
    ("config_text", "expected"),
    [
        (None, "has no config.json"),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({**TINY_HF_CONFIG, "model_type": "gpt2"}), "model_type='gpt2' is not supported"),
        (json.dumps({k: v for k, v in TINY_HF_CONFIG.items() if k != "hidden_size"}), "'hidden_size'"),
        (json.dumps({**TINY_HF_CONFIG, "num_key_value_heads": 3}), "not a multiple of num_key_value_heads=3"),
        (json.dumps({**TINY_HF_CONFIG, "use_sliding_window": True}), "use_sliding_window"),
        (json.dumps({**TINY_HF_CONFIG, "hidden_act": "gelu"}), "hidden_act='gelu'"),
        (json.dumps({**TINY_HF_CONFIG, "vocab_size": "32"}), "vocab_size='32' must be an int"),
    ],
)
def test_folder_with_a_bad_config_is_a_clear_error(
    tmp_path: Path, config_text: str | None, expected: str
) -> None:
    folder = tmp_path / "bad"
    _write_checkpoint(folder)
    if config_text is None:
        (folder / "config.json").unlink()
    else:
        (folder / "config.json").write_text(config_text)
    with pytest.raises(ModelLoadError, match=r"config\.json") as caught:
        load_model(str(folder), device="cpu")
    assert expected in str(caught.value)


def test_folder_without_safetensors_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    _write_checkpoint(folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors weights .*pytorch_model\.bin"):
        load_model(str(folder), device="cpu")


def test_folder_without_tokenizer_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "notok"
    _write_checkpoint(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        load_model(str(folder), device="cpu")


def test_weights_that_do_not_match_the_config_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "mismatch"
    _write_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ModelLoadError, match=r"missing layers\.2\."):
        load_model(str(folder), device="cpu")
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    shape_error = r"mlp\.\w+_proj\.weight has shape \(\d+, \d+\), the config implies"
    with pytest.raises(ModelLoadError, match=shape_error):
        load_model(str(folder), device="cpu")


def test_bad_device_and_dtype_are_value_errors() -> None:
    with pytest.raises(ValueError, match="dtype 'int7'"):
        load_model("sage-tiny", device="cpu", dtype="int7")
    with pytest.raises(ValueError, match="device 'tpu9'"):
        load_model("sage-tiny", device="tpu9")


# ---- configs -----------------------------------------------------------------------------------------


def test_transformers_4_layout_with_linear_rope_scaling() -> None:
    config = ModelConfig.from_hf_config(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_theta": 500000.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "attention_bias": True,
            "eos_token_id": [7, 8],
            "torch_dtype": "bfloat16",
        }
    )
    assert config.head_dim == 8 and config.num_key_value_heads == 2
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert config.attention_bias and config.attention_out_bias
    assert config.eos_token_id == 7
    assert config.dtype == torch.bfloat16


def test_unsupported_rope_scaling_is_rejected() -> None:
    hf = {**TINY_HF_CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ValueError, match="rope scaling 'yarn' is not supported"):
        ModelConfig.from_hf_config(hf)


def test_architecture_from_the_class_name_when_model_type_is_absent() -> None:
    hf = {k: v for k, v in TINY_HF_CONFIG.items() if k != "model_type"}
    assert ModelConfig.from_hf_config(hf).architecture == "qwen2"
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_hf_config({**hf, "architectures": ["GPT2LMHeadModel"]})


# ---- tokenizers --------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_utf8() -> None:
    tokenizer = ByteTokenizer()
    text = "héllo, 世界 🙂"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id
    assert all(0 <= i < 256 for i in ids[1:])
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*ids, tokenizer.eos_token_id]) == text
    assert tokenizer.eos_token_ids == {tokenizer.eos_token_id}


def test_byte_tokenizer_decodes_a_partial_character_without_raising() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode("世")[1:]
    assert len(ids) == 3
    assert tokenizer.decode(ids[:2]) == "\ufffd"
    assert tokenizer.decode([0xFF, 0x41]) == "\ufffdA"


def test_incremental_detokenizer_never_splits_a_character() -> None:
    tokenizer = ByteTokenizer()
    text = "añ世🙂!"
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=tokenizer.encode("prompt"))
    deltas = [detok.push(i) for i in tokenizer.encode(text)[1:]]
    assert "".join(deltas) == text == detok.text
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[:3] == ["a", "", "ñ"]


def test_incremental_detokenizer_flushes_an_incomplete_tail() -> None:
    tokenizer = ByteTokenizer()
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ord("x")) == "x"
    assert detok.push(0xE4) == ""
    assert detok.flush() == "\ufffd"
    assert detok.text == "x\ufffd"


def test_incremental_detokenizer_with_a_tokenizer_json(tmp_path: Path) -> None:
    _write_tokenizer(tmp_path)
    tokenizer = HFTokenizer.from_folder(tmp_path)
    ids = tokenizer.encode("a b c")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=ids[:1])
    text = "".join(detok.push(i) for i in ids[1:])
    assert tokenizer.decode(ids[:1]) + text == tokenizer.decode(ids)
