"""Text marks and the ``retokenised`` miss reason (issue 51, item 5: "a text that tokenised
differently"): the marks of a prompt agree with its tokenizer's offsets (the byte tokenizer and a
byte-level BPE `tokenizers` model, for any text: hypothesis); a prompt whose text a recent one had
is told retokenised exactly when the two tokenised it differently (a leading bos one side added; a
word cut at the end of one prompt and whole in the next), never across salts; the text window
stays within its bound however many unique prompts pass.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.cache.block_allocator import BlockAllocator
from engine_adapter.cache.cache_manager import CacheManager
from engine_adapter.cache.receipts import MissWindows
from engine_adapter.cache.request import CacheRequest
from engine_adapter.cache.text_marks import MARK_CHARS, text_marks
from engine_adapter.model.tokenizer import ByteTokenizer, HFTokenizer

BS = 4
WORDS = ["hello", "world", "the", "cache", "keeps", "blocks", "of", "tokens", "and", "hellos", "come", "back"]


@pytest.fixture(scope="module")
def bpe() -> HFTokenizer:
    """A byte-level BPE trained here on a few words (merges whole words: ``hello`` is one token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([" ".join(WORDS)] * 50, trainer)
    return HFTokenizer(tokenizer, bos_token_id=0, eos_token_ids=[0])


def token_digest(ids: list[int], n: int, size: int = 12) -> bytes:
    """The digest of ``ids[:n]`` in one pass: what a mark's incremental digest must equal."""
    return hashlib.blake2b(array("q", ids[:n]).tobytes(), digest_size=size).digest()


def _marks(tokenizer: Any, text: str, *, every: int = MARK_CHARS, special: bool = False) -> Any:
    ids, ends = tokenizer.encode_offsets(text, add_special_tokens=special)
    assert ids == tokenizer.encode(text, add_special_tokens=special)
    return ids, text_marks(text, ids, ends, every=every)


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=0, max_size=300), every=st.integers(1, 70), bos=st.booleans())
def test_a_byte_prompt_marks_the_bytes_of_each_prefix(text: str, every: int, bos: bool) -> None:
    ids, marks = _marks(ByteTokenizer(), text, every=every, special=bos)
    assert marks.chars == tuple(range(every, len(text) + 1, every))
    for c, n, digest in zip(marks.chars, marks.tokens, marks.token_digest, strict=True):
        assert n == int(bos) + len(text[:c].encode("utf-8"))  # every byte of the first c characters
        assert digest == token_digest(ids, n)


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.sampled_from([*WORDS, "hel", "lo", "xyz", "\u00e9t\u00e9"]), max_size=60))
def test_a_bpe_prompt_marks_the_tokens_whose_text_ends_within(bpe: HFTokenizer, words: list[str]) -> None:
    text = " ".join(words)
    ids, marks = _marks(bpe, text, every=16)
    for c, n, digest in zip(marks.chars, marks.tokens, marks.token_digest, strict=True):
        assert text[:c].startswith(bpe.decode(ids[:n]))  # the tokens within end by c ...
        assert n == len(ids) or not text[:c].startswith(bpe.decode(ids[: n + 1]))  # ... the next does not
        assert digest == token_digest(ids, n)


def test_the_same_text_tokenised_alike_is_not_retokenised(bpe: HFTokenizer) -> None:
    text = " ".join(WORDS * 4)
    windows = MissWindows(1_000)
    windows.saw_text(None, _marks(bpe, text)[1])
    assert windows.retokenised(None, _marks(bpe, text + " more words")[1]) is None


def test_a_word_cut_at_a_prompt_end_and_whole_in_the_next_is_retokenised(bpe: HFTokenizer) -> None:
    head = " ".join(WORDS * 3)
    cut = head[: MARK_CHARS * 2 - 3] + "hel"  # the prompt ends inside "hello", at a mark
    ids, cut_marks = _marks(bpe, cut)
    whole = cut + "lo world"
    whole_ids, whole_marks = _marks(bpe, whole)
    assert ids[-1] != whole_ids[len(ids) - 1]  # "hel" alone, then "hello" in the longer text
    windows = MissWindows(1_000)
    windows.saw_text(None, cut_marks)
    found = windows.retokenised(None, whole_marks)
    assert found is not None and found[0] == MARK_CHARS * 2
    assert found[1] < len(ids)  # "hello" crosses the mark: fewer tokens end within it
    assert windows.retokenised("tenant-b", whole_marks) is None  # never across salts


def test_the_text_window_holds_at_most_its_capacity() -> None:
    windows = MissWindows(64)
    tokenizer = ByteTokenizer()
    for i in range(500):  # 500 unique prompts of 4 marks each
        windows.saw_text(None, _marks(tokenizer, f"{i:08d}" * 32)[1])
        assert len(windows._texts) <= 64
    windows.clear()
    assert not windows._texts


def _cache() -> CacheManager:
    return CacheManager(BlockAllocator(64, BS), clock=lambda: 0.0)


def _run(
    cache: CacheManager, sid: int, ids: list[int], marks: Any, salt: str | None = None
) -> dict[str, Any]:
    request = CacheRequest(sid, ids, cache_salt=salt, request_id=f"req-{sid}", text_marks=marks)
    cache.allocate(request)
    cache.free_sequence(sid, ids)
    answer = cache.request_receipt(f"req-{sid}")
    assert answer is not None
    return answer


def test_a_cache_tells_the_text_a_leading_bos_tokenised_differently() -> None:
    tokenizer = ByteTokenizer()
    text = "The system prompt every turn of the session shares, long enough for marks. " * 3
    cache = _cache()
    plain_ids, plain = _marks(tokenizer, text)
    _run(cache, 1, plain_ids, plain)
    with_bos, marks = _marks(tokenizer, text, special=True)  # the same text, a bos before it
    misses = _run(cache, 2, with_bos, marks)["misses"]
    told = misses[0]
    assert told["reason"] == "retokenised" and told["first_block"] == 0
    assert told["text_chars"] == len(text) // MARK_CHARS * MARK_CHARS
    assert told["blocks"] * BS >= told["text_chars"]  # every block that starts within the text
    salted_ids, salted = _marks(tokenizer, text + "!", special=True)
    assert _run(cache, 3, salted_ids, salted, salt="b")["misses"][0]["reason"] != "retokenised"
    again = _run(cache, 4, with_bos, marks)  # now cached as these tokens: read, not retokenised
    assert again["cached_tokens"] > 0 and "retokenised" not in {m["reason"] for m in again["misses"]}


def test_a_prompt_without_marks_is_never_retokenised() -> None:
    tokenizer = ByteTokenizer()
    text = "token ids only: nothing says what text they came from, so nothing is compared. " * 2
    cache = _cache()
    _run(cache, 1, *_marks(tokenizer, text))
    with_bos, _ = _marks(tokenizer, text, special=True)
    assert _run(cache, 2, with_bos, None)["misses"][0]["reason"] == "first_use"
