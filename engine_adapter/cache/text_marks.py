"""Text marks: where a prompt's text stood every `MARK_CHARS` characters, and its tokens there.

A prompt cache matches token blocks, so a client that sends the same text as before can still
miss it: the text was tokenised differently. The usual causes are a leading special token one
route adds and another does not (a completion's bos against a rendered chat), and text that
re-enters a prompt after being generated (the model emitted ``" Hello"`` as two tokens; the
next turn's text tokenises it as one). Request receipts name this reason (``retokenised``:
`engine_adapter.cache.receipts`) by comparing a prompt with the earlier ones whose text it
shares, without keeping any text: a prompt brings one mark per `MARK_CHARS` characters,

- ``text``: a digest of its first ``chars`` characters,
- ``tokens``: how many of its tokens end within them, and
- ``token_digest``: a digest of those tokens' ids,

and the receipts keep a bounded window of the marks of recent prompts. A later prompt with a
mark whose text digest is in the window, under the same isolation key, shares that much text;
if its count or token digest there differs from the earlier prompt's, the shared text was
tokenised differently (same text and same tokens give the same count: a token's text ends where
it ends in both).

The serving layer builds the marks where it tokenises text (the tokenizer's character offsets:
`Tokenizer.encode_offsets`); a prompt given as token ids has none. This module imports nothing
of the cache.
"""

from __future__ import annotations

import bisect
import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MARK_CHARS", "TextMarks", "text_marks"]

MARK_CHARS = 64
"""Characters between marks: about one 16-token block of English text, so a divergence is
placed to within a block or two, at a mark's cost (three small values) per 64 characters."""

_DIGEST_SIZE = 12  # 96 bits: a collision between two recent prompts' marks is not a concern


@dataclass(frozen=True, slots=True)
class TextMarks:
    """A prompt's marks, in increasing order of `chars` (the module docstring says each part)."""

    chars: tuple[int, ...]
    text: tuple[bytes, ...]
    tokens: tuple[int, ...]
    token_digest: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.chars)


def _ids_bytes(ids: Sequence[int]) -> bytes:
    return array("q", ids).tobytes()


def text_marks(text: str, ids: Sequence[int], ends: Sequence[int], every: int = MARK_CHARS) -> TextMarks:
    """The marks of `text`, tokenised into `ids`, the character where each token's text ends
    being `ends` (0 for a special token the tokenizer added, which has no text; never
    decreasing: `Tokenizer.encode_offsets` says how far each token and those before it reach).

    Both digests are taken incrementally (each character and id hashed once), so a long prompt
    costs one pass.
    """
    if every < 1:
        raise ValueError(f"every={every} must be at least 1")
    text_hash = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    ids_hash = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    chars, texts, counts, digests = [], [], [], []
    n = 0
    for c in range(every, len(text) + 1, every):
        text_hash.update(text[c - every : c].encode("utf-8", "surrogatepass"))
        start, n = n, bisect.bisect_right(ends, c, lo=n)
        ids_hash.update(_ids_bytes(ids[start:n]))
        chars.append(c)
        texts.append(text_hash.copy().digest())
        counts.append(n)
        digests.append(ids_hash.copy().digest())
    return TextMarks(tuple(chars), tuple(texts), tuple(counts), tuple(digests))
