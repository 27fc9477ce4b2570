"""Tokenizers behind one small protocol: the built-in byte tokenizer and a ``tokenizer.json`` one.

`IncrementalDetokenizer` turns a stream of generated ids into text deltas that never split a
multi-byte character, for streaming and for stop strings.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["ByteTokenizer", "HFTokenizer", "IncrementalDetokenizer", "Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine needs of a tokenizer."""

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a generation (instruct models often have more than one)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template, or None when it has none (a base model)."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; `add_special_tokens` adds those the model expects (a leading bos).

        A rendered chat template already holds its special tokens: encode it with False.
        """
        ...

    def encode_offsets(self, text: str, *, add_special_tokens: bool = True) -> tuple[list[int], list[int]]:
        """`encode`'s ids and, for each, the character of `text` where its text and that of the
        tokens before it end (0 for a special token the tokenizer added, which has no text;
        never decreasing): a prompt's text marks (`engine_adapter.cache.text_marks`)."""
        ...

    def token_text(self, token_id: int | None) -> str:
        """The text of one token (for a template's ``bos_token``/``eos_token``), or ""."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens left out; never raises on a partial character."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then bos, eos and pad (the tokenizer of ``sage-tiny``).

    Args:
        add_bos: `encode` puts bos first.
        chat_template: The Jinja chat template (None: the chat endpoint refuses).
    """

    BOS = 256
    EOS = 257
    PAD = 258
    NUM_SPECIAL = 3

    def __init__(self, *, add_bos: bool = True, chat_template: str | None = None) -> None:
        self.add_bos = add_bos
        self._chat_template = chat_template

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @property
    def bos_token_id(self) -> int:
        return self.BOS

    @property
    def eos_token_id(self) -> int:
        return self.EOS

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset((self.EOS,))

    @property
    def vocab_size(self) -> int:
        return 256 + self.NUM_SPECIAL

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.BOS, *ids] if self.add_bos and add_special_tokens else ids

    def encode_offsets(self, text: str, *, add_special_tokens: bool = True) -> tuple[list[int], list[int]]:
        ids = self.encode(text, add_special_tokens=add_special_tokens)
        if text.isascii():  # one byte a character
            ends = list(range(1, len(text) + 1))
        else:  # every byte of a character ends with it
            ends = [k + 1 for k, ch in enumerate(text) for _ in range(len(ch.encode("utf-8")))]
        return ids, [0] * (len(ids) - len(ends)) + ends

    def token_text(self, token_id: int | None) -> str:
        return ""  # the specials have no text

    def decode(self, ids: Sequence[int]) -> str:
        # errors="replace": a cut multi-byte character (or a random model's invalid byte) reads
        # as U+FFFD instead of raising.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"ByteTokenizer(add_bos={self.add_bos})"


# The words a `tokenizers` BPE (or Unigram) model keeps the merges of (its default: 10,000). The
# engine keeps none: the cache fills for as long as new words arrive, never evicts, and holds a
# kilobyte or more for a long word, so an engine serving unique prompts grew by it for 10,000
# requests and more (issue 49: SmolLM2's soak held 3.2 MiB per 10,000 requests with it, flat
# without it). Merging a word again costs about 0.24 us a token (1.10 against 0.86 us, an
# 8,528-token text), half a millisecond on a 2,000-token prompt whose prefill takes a second.
WORD_CACHE = 0


def _no_word_cache(tokenizer: Any) -> None:
    """Resize `tokenizer`'s word cache to `WORD_CACHE` where its model has one."""
    resize = getattr(getattr(tokenizer, "model", None), "_resize_cache", None)
    if resize is not None:
        resize(WORD_CACHE)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` read with the `tokenizers` package.

    Its model's word cache is turned off (`WORD_CACHE`): bounded memory over unique prompts.

    Args:
        tokenizer: A `tokenizers.Tokenizer` (its model's word cache is resized in place).
        bos_token_id: Beginning-of-sequence id, if the model has one.
        eos_token_ids: Ids that end a generation; the first is `eos_token_id`.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        chat_template: str | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        _no_word_cache(tokenizer)
        self._bos_token_id = bos_token_id
        self._eos_list = list(dict.fromkeys(eos_token_ids))
        self._eos_token_ids = frozenset(self._eos_list)
        self._chat_template = chat_template

    @classmethod
    def from_folder(cls, folder: str | Path, hf_config: Mapping[str, Any] | None = None) -> HFTokenizer:
        """Load ``tokenizer.json`` and find bos/eos ids in the files beside it.

        The ids come from ``tokenizer_config.json`` (``bos_token``/``eos_token`` as strings),
        else from `hf_config` (``config.json``); ``generation_config.json`` may add eos ids.

        Raises:
            FileNotFoundError: There is no ``tokenizer.json`` in `folder`.
        """
        from tokenizers import Tokenizer as RustTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (only tokenizer.json tokenizers are supported)")
        tokenizer = RustTokenizer.from_file(str(path))
        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        generation_config = _read_json(folder / "generation_config.json")
        hf_config = hf_config or {}

        def token_id(key: str) -> int | None:
            token = tokenizer_config.get(key)
            if isinstance(token, Mapping):
                token = token.get("content")
            if isinstance(token, str):
                found = tokenizer.token_to_id(token)
                if found is not None:
                    return int(found)
            return None

        bos = token_id("bos_token")
        if bos is None:
            bos = next(iter(_ids(hf_config.get("bos_token_id"))), None)
        eos: list[int] = []
        first = token_id("eos_token")
        if first is not None:
            eos.append(first)
        eos += _ids(hf_config.get("eos_token_id")) + _ids(generation_config.get("eos_token_id"))
        template = tokenizer_config.get("chat_template")
        return cls(
            tokenizer,
            bos_token_id=bos,
            eos_token_ids=eos,
            chat_template=template if isinstance(template, str) else None,
        )

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_list[0] if self._eos_list else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_offsets(self, text: str, *, add_special_tokens: bool = True) -> tuple[list[int], list[int]]:
        encoding = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        # A trimmed offset (byte-level BPE drops a token's surrounding spaces from it) may end
        # before the token before it: how far the tokens so far reach never decreases.
        return list(encoding.ids), list(itertools.accumulate((end for _, end in encoding.offsets), max))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token_id: int | None) -> str:
        """The text of one token as written in the vocabulary (``"<|im_end|>"``), or ""."""
        if token_id is None:
            return ""
        return str(self._tokenizer.id_to_token(token_id) or "")

    def save_folder(self, folder: str | Path) -> Path:
        """Write it as a Hugging Face tokenizer folder (``tokenizer.json`` and a
        ``tokenizer_config.json`` naming its special tokens and chat template), which
        ``transformers.AutoTokenizer`` loads as this very tokenizer: a reference that reads the
        tokenizer from a model's path (kvpress's KVzip) then tokenizes as sage does."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tokenizer.save(str(folder / "tokenizer.json"))
        config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        for key, token_id in (("bos_token", self._bos_token_id), ("eos_token", self.eos_token_id)):
            if token_id is not None:
                config[key] = self.token_text(token_id)
        if self._chat_template is not None:
            config["chat_template"] = self._chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        return folder

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
            f"eos_token_ids={sorted(self.eos_token_ids)})"
        )


class IncrementalDetokenizer:
    """Text deltas of a generation, one id at a time, that never end inside a character.

    Decodes a short window of ids (some of the prompt for context, since tokenizers such as
    SentencePiece drop a leading space at the start of a decode) and emits what was added, holding
    it back while it ends in U+FFFD (an incomplete UTF-8 sequence).

    Args:
        tokenizer: Any `Tokenizer`.
        prompt_ids: The prompt, whose last few ids give the first generated ids their context.
    """

    _CONTEXT = 5

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = list(prompt_ids[-self._CONTEXT :])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one generated id; returns the text it completes (often ``""`` mid-character)."""
        self._ids.append(token_id)
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """The text held back at the end of a generation (an incomplete character as U+FFFD)."""
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        delta = full[len(prefix) :] if len(full) > len(prefix) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        loaded = json.load(f)
    return loaded if isinstance(loaded, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []
