"""The engine's tokenizer keeps no word cache (issue 49).

A `tokenizers` BPE model keeps the merges of up to 10,000 words it has seen and never evicts one:
over unique prompts it fills for as long as new words arrive, a kilobyte or more a long word. It
was what was left of SmolLM2's unique-prompt soak (3.2 MiB per 10,000 requests, flat without it).
`HFTokenizer` turns it off (`WORD_CACHE`): 10,000 new 40-letter words grow a raw tokenizer by
about 16 MiB and the engine's by well under one (the same words' transient allocations).
"""

from __future__ import annotations

import random
import string
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import BPE

from engine_adapter.model.tokenizer import WORD_CACHE, HFTokenizer

REPO = Path(__file__).resolve().parents[1]


def _byte_level_bpe() -> Tokenizer:
    """A byte-level BPE with no merges (every byte its own token), built as GPT-2's is."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(BPE({char: i for i, char in enumerate(alphabet)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tokenizer


_GROWTH = """
import random, string, sys
sys.path.insert(0, sys.argv[1])
from tests.test_tokenizer_word_cache import _byte_level_bpe
from engine_adapter.model.tokenizer import HFTokenizer

def rss_mib():
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20

def growth(encode, seed):  # 10,000 new 40-letter words, 50 to a text
    rng = random.Random(seed)
    before = rss_mib()
    for _ in range(200):
        encode(" ".join("".join(rng.choices(string.ascii_letters, k=40)) for _ in range(50)))
    return rss_mib() - before

engines = HFTokenizer(_byte_level_bpe(), bos_token_id=None, eos_token_ids=[])
grew = growth(engines.encode, 1)  # first: the raw run's cache is not yet there to reuse
raw = _byte_level_bpe()
print(grew, growth(lambda text: raw.encode(text), 2))
"""


def test_unique_words_do_not_grow_the_engines_tokenizer() -> None:
    """In a fresh process (a long-lived one's allocator may already hold the room)."""
    assert WORD_CACHE == 0
    run = subprocess.run(
        [sys.executable, "-c", _GROWTH, str(REPO)], capture_output=True, text=True, check=True, timeout=120
    )
    grew, control = map(float, run.stdout.split())
    assert control > 8.0, f"the control: a raw tokenizer's cache kept only {control:.1f} MiB"
    assert grew < 2.0, f"the engine's tokenizer grew {grew:.1f} MiB over 10,000 new words"


def test_the_word_cache_changes_no_token() -> None:
    """Without its cache a tokenizer gives the ids it gives with it (the cache only saves work)."""
    rng = random.Random(3)
    texts = [" ".join(rng.choice(["cache", "block", "evict", "Paris", "naïve", "東京"]) for _ in range(30))]
    texts += ["".join(rng.choices(string.printable, k=200)) for _ in range(20)]
    engines = HFTokenizer(_byte_level_bpe(), bos_token_id=None, eos_token_ids=[])
    raw = _byte_level_bpe()
    for text in texts * 2:  # the second pass: the raw one answers from its cache
        assert engines.encode(text) == list(raw.encode(text).ids)
