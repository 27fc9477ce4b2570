"""Predictive: evict the block whose owning sequence is expected to finish soonest.

Source: the module spec's `PredictiveEvictionPolicy` and `PredictiveEvictionWithML`
(the module spec: estimated remaining lifetime first, then sequence_length / max_length, then
recency; use a prediction only above a confidence threshold such as 90 %), ordered
lexicographically as in docs/architecture.md, "Policies and the registry".

The order is: shortest predicted remaining lifetime first (entries with no prediction, or
one below `confidence_threshold`, come after every predicted one), then the highest
completion ratio `seq_len / max_len`, then least recent. A predicted lifetime is turned into
a predicted end time `meta.last_access + lifetime` (the cache's clock), so that entries
scored at different times compare by what is left of their lives now. The score is computed
when the entry is inserted, hit or made evictable, which keeps every operation O(log n).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any, Protocol, runtime_checkable

from sage_eviction.heap import FlatHeapPolicy
from sage_eviction.preemption import (  # its defaults, which its preemption order reads too
    DEFAULT_CONFIDENCE_THRESHOLD,
    DEFAULT_DECODE_TIME_PER_TOKEN,
    DEFAULT_TOKEN_ESTIMATE_CONFIDENCE,
)
from sage_eviction.types import EntryMeta, EvictionStrategy

__all__ = ["LifetimePredictor", "PredictivePolicy", "RemainingTokensPredictor"]


@runtime_checkable
class LifetimePredictor(Protocol):
    """Predicts how long the sequence owning a block will live on."""

    def predict(self, meta: EntryMeta) -> tuple[float, float] | None:
        """The remaining lifetime in seconds from `meta.last_access` and a confidence in
        [0, 1], or None when there is nothing to go on."""
        ...


class RemainingTokensPredictor:
    """The default predictor.

    `meta.estimated_lifetime`, when the cache set it (from an external lifetime model), is
    taken with confidence 1. Otherwise, when `max_len` is known, the tokens left to decode
    times the per-token decode time, with `token_estimate_confidence` (`max_len` is an upper
    bound: a sequence may stop early).
    """

    def __init__(
        self,
        decode_time_per_token: float = DEFAULT_DECODE_TIME_PER_TOKEN,
        token_estimate_confidence: float = DEFAULT_TOKEN_ESTIMATE_CONFIDENCE,
    ) -> None:
        self.decode_time_per_token = decode_time_per_token
        self.token_estimate_confidence = token_estimate_confidence

    def predict(self, meta: EntryMeta) -> tuple[float, float] | None:
        if meta.estimated_lifetime is not None:
            return (meta.estimated_lifetime, 1.0)
        if meta.max_len > 0:
            remaining = max(meta.max_len - meta.seq_len, 0)
            return (remaining * self.decode_time_per_token, self.token_estimate_confidence)
        return None


def _completion(seq_len: int, max_len: int) -> float:
    return seq_len / max_len if max_len > 0 else 0.0


class PredictivePolicy(FlatHeapPolicy):
    """Evicts the evictable entry predicted to finish first; see the module docstring.

    Args:
        capacity: Cache size in blocks (unused).
        predictor: A `LifetimePredictor`; `RemainingTokensPredictor` built from the two
            params below when None.
        confidence_threshold: Predictions with a lower confidence are ignored.
        decode_time_per_token: Seconds per decoded token, for the default predictor.
        token_estimate_confidence: The default predictor's confidence in its token-count
            estimate (set it below `confidence_threshold` to order by completion ratio).
    """

    name = "predictive"
    strategy = EvictionStrategy.PREDICTIVE
    paper = "sageLLM KV eviction module spec, PredictiveEvictionPolicy with a lifetime predictor"

    def __init__(
        self,
        capacity: int | None = None,
        predictor: LifetimePredictor | None = None,
        confidence_threshold: float = DEFAULT_CONFIDENCE_THRESHOLD,
        decode_time_per_token: float = DEFAULT_DECODE_TIME_PER_TOKEN,
        token_estimate_confidence: float = DEFAULT_TOKEN_ESTIMATE_CONFIDENCE,
    ) -> None:
        super().__init__(capacity)
        if not 0.0 <= confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold={confidence_threshold} must be in [0, 1]")
        if not 0.0 <= decode_time_per_token < math.inf:
            raise ValueError(f"decode_time_per_token={decode_time_per_token} must be a finite number >= 0")
        if not 0.0 <= token_estimate_confidence <= 1.0:
            raise ValueError(f"token_estimate_confidence={token_estimate_confidence} must be in [0, 1]")
        if predictor is None:
            predictor = RemainingTokensPredictor(decode_time_per_token, token_estimate_confidence)
        elif not callable(getattr(predictor, "predict", None)):
            raise TypeError(f"predictor={predictor!r} has no predict(meta) method")
        self.predictor = predictor
        self.confidence_threshold = confidence_threshold
        self.decode_time_per_token = decode_time_per_token
        self.token_estimate_confidence = token_estimate_confidence

    def _score(self, key: Hashable, meta: EntryMeta) -> tuple[Any, ...]:
        end = math.inf
        prediction = self.predictor.predict(meta)
        if prediction is not None:
            lifetime, confidence = prediction
            if confidence >= self.confidence_threshold and not math.isnan(lifetime):
                end = meta.last_access + lifetime
        return (end, -_completion(meta.seq_len, meta.max_len), self._tick[key])

    def _compiled_scoring(self) -> tuple[str, tuple[float, ...]] | None:
        predictor = self.predictor
        if type(predictor) is not RemainingTokensPredictor:
            return None  # a model of the user's: only Python can call it
        params = (
            predictor.decode_time_per_token,
            predictor.token_estimate_confidence,
            self.confidence_threshold,
        )
        return ("predictive", params) if all(type(v) is float for v in params) else None

    explains_by = "predicted end of its sequence, then completion, then recency"

    def _explain_values(self, key: Hashable, meta: EntryMeta) -> dict[str, object]:
        prediction = self.predictor.predict(meta)
        rank = self.rank(key)
        assert rank is not None
        return {
            "predicted_end": rank[0],
            "lifetime": None if prediction is None else prediction[0],
            "confidence": None if prediction is None else prediction[1],
            "confidence_threshold": self.confidence_threshold,
            "completion": _completion(meta.seq_len, meta.max_len),
        }

    preemption_order = "predictive"  # its default sequence order (preemption.ORDERS)
