"""Sampling parameters of a request and the next-token choice from a row of logits.

Greedy when ``temperature == 0``; otherwise temperature, then top-k, then top-p (nucleus), then
a draw from the request's own `torch.Generator`, so a seeded request gives the same tokens
whatever else runs in the batch. Draws happen on the CPU, so they are also the same on a CUDA
machine for the same logits. OpenAI's frequency and presence penalties are applied to the logits
before either (`engine_adapter.model.penalties`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["SamplingParams", "make_generator", "sample", "sample_batch"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How a request picks its tokens and when it stops.

    Attributes:
        temperature: 0 for greedy (argmax); otherwise logits are divided by it. Finite, >= 0.
        top_p: Keep the smallest set of most likely tokens whose probability reaches `top_p`;
            in (0, 1], 1 keeps all.
        top_k: Keep the `top_k` most likely tokens; 0 (or -1) keeps all.
        max_tokens: Most tokens to generate, >= 1.
        stop: Strings that end the generation when they appear in the output (not included in it).
            A list or a single string; stored as a tuple.
        seed: Seed of the request's generator; None draws a fresh seed.
        ignore_eos: Keep generating past the eos token (benchmarks).
        frequency_penalty: OpenAI's: subtracted from a token's logit once per time it was
            generated so far, in [-2, 2].
        presence_penalty: OpenAI's: subtracted from a token's logit once it was generated, in
            [-2, 2].

    Raises:
        ValueError: A value out of range; the message names it.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ValueError(f"temperature={self.temperature!r} must be a number")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r} must be finite and >= 0")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float):
            raise ValueError(f"top_p={self.top_p!r} must be a number")
        if not 0.0 < self.top_p <= 1.0:  # also rejects NaN
            raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k={self.top_k!r} must be an int >= 1, or 0 / -1 for no limit")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens!r} must be an int >= 1")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if stop is None:
            stop = ()
        if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop={self.stop!r} must be a non-empty string or a list of them")
        object.__setattr__(self, "stop", tuple(stop))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r} must be an int or None")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}={value!r} must be a number in [-2, 2]")

    @property
    def penalized(self) -> bool:
        """Whether a frequency or presence penalty changes the logits."""
        return self.frequency_penalty != 0 or self.presence_penalty != 0

    @property
    def greedy(self) -> bool:
        """Argmax decoding (temperature 0)."""
        return self.temperature == 0


def make_generator(seed: int | None) -> torch.Generator:
    """The CPU generator of one request: seeded with `seed`, or from OS entropy when None."""
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)  # negative seeds allowed, as in Python
    return generator


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """The next token from one row of logits ``[vocab_size]``.

    Args:
        logits: Next-token logits of one sequence, any device and float dtype.
        params: The request's sampling parameters.
        generator: The request's CPU generator (`make_generator`); None uses torch's global one.
    """
    if logits.dim() != 1:
        raise ValueError(f"sample takes one row of logits [vocab_size], got shape {tuple(logits.shape)}")
    if params.greedy:
        return int(torch.argmax(logits))
    probs = _filtered_probs(logits.detach().to("cpu", torch.float32), params)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_batch(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """The next token of every row of ``logits`` ``[batch, vocab_size]``: one argmax for the greedy
    rows together, then one draw per sampled row with that row's generator."""
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(
            f"sample_batch needs logits [batch, vocab] and one params and generator per row: got "
            f"logits {tuple(logits.shape)}, {len(params)} params, {len(generators)} generators"
        )
    tokens = torch.argmax(logits, dim=-1).tolist()
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = logits[sampled].detach().to("cpu", torch.float32)
        for row, i in zip(rows, sampled, strict=True):
            probs = _filtered_probs(row, params[i])
            tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    return [int(t) for t in tokens]


def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p; removed tokens have probability 0.

    Always a distribution `torch.multinomial` accepts, whatever valid params say: the logits are
    shifted so that their maximum is 0 before the temperature divides them (a tiny temperature
    then gives -inf, never inf - inf), top-p always keeps the most likely token (a tiny top_p
    rounds to 0 in float32), and a row that is still not finite falls back to its argmax.
    """
    scaled = (logits - logits.max()) / params.temperature
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Drop a token when the ones before it already reach top_p; the first is always kept.
        drop_sorted = (cumulative - sorted_probs) >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        probs = torch.zeros_like(probs)
        probs[int(torch.argmax(logits))] = 1.0
    return probs
