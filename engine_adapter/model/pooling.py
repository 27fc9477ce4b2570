"""Sentence embeddings from the served decoder: mean pooling of the last hidden state, L2-normalised.

An embedding request's text runs through the decoder in chunks (`ForwardBatch.pool_hidden`):
each chunk's forward returns the sum of its tokens' final-normed hidden states, `MeanPool` adds
the sums up, and `MeanPool.vector` divides by the token count and normalises, so the vector of
a text is the same however it was cut into chunks (up to float rounding).
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass, field

import torch

__all__ = ["MeanPool", "decode_base64", "encode_base64"]


@dataclass(slots=True)
class MeanPool:
    """The running sum of one text's hidden states over its chunks.

    Attributes:
        total: ``[hidden_size]`` float32 sum, or None before the first chunk.
        tokens: Tokens summed so far.
    """

    total: torch.Tensor | None = None
    tokens: int = 0
    _done: bool = field(default=False, repr=False)

    def add(self, chunk_sum: torch.Tensor, num_tokens: int) -> None:
        """Add one chunk's sum (``ForwardOutput.hidden_sums[row]``) of `num_tokens` tokens."""
        if num_tokens <= 0:
            raise ValueError(f"a chunk of {num_tokens} tokens adds nothing")
        chunk = chunk_sum.detach().to(torch.float32)
        self.total = chunk.clone() if self.total is None else self.total + chunk
        self.tokens += num_tokens

    def vector(self) -> list[float]:
        """The mean over every token, L2-normalised (a zero vector stays zero).

        Raises:
            ValueError: No chunk was added.
        """
        if self.total is None or self.tokens == 0:
            raise ValueError("no token was pooled")
        mean = self.total / self.tokens
        norm = float(torch.linalg.vector_norm(mean))
        if norm > 0.0 and math.isfinite(norm):
            mean = mean / norm
        return [float(x) for x in mean.cpu().tolist()]


def encode_base64(vector: list[float]) -> str:
    """OpenAI's ``encoding_format: base64``: little-endian float32s, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def decode_base64(text: str) -> list[float]:
    """The inverse of `encode_base64` (what the openai client does with numpy)."""
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))
