"""The predictive memory planner's two predictors (spec section 3.1), learnt online.

- `OutputLengthPredictor`: output tokens of a request from its prompt length, the mean of the
  finished requests in the same prompt-length bucket (powers of two), falling back to the
  mean over all, then to a prior; clamped to the request's `max_tokens`.
- `EmbeddingLoadForecaster`: the recent arrival rate of embedding work, in blocks per second,
  as an exponentially weighted rate with a time constant (so it follows a shifting mix).

Both are pure functions of what they were told: no clock of their own.
"""

from __future__ import annotations

import math

__all__ = ["EmbeddingLoadForecaster", "OutputLengthPredictor"]


class OutputLengthPredictor:
    """Mean output length per prompt-length bucket, learnt from finished requests.

    Args:
        prior_tokens: The prediction before anything has finished.
    """

    __slots__ = ("_count", "_prior", "_sums", "_total", "_total_count")

    def __init__(self, prior_tokens: int = 256) -> None:
        self._prior = max(1, int(prior_tokens))
        self._sums: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._total = 0.0
        self._total_count = 0

    @staticmethod
    def _bucket(prompt_tokens: int) -> int:
        return max(0, int(prompt_tokens)).bit_length()

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        """Learn from one finished request."""
        bucket = self._bucket(prompt_tokens)
        self._sums[bucket] = self._sums.get(bucket, 0.0) + output_tokens
        self._count[bucket] = self._count.get(bucket, 0) + 1
        self._total += output_tokens
        self._total_count += 1

    def predict(self, prompt_tokens: int, max_tokens: int) -> int:
        """Predicted output tokens, in [1, max_tokens]."""
        bucket = self._bucket(prompt_tokens)
        if self._count.get(bucket):
            mean = self._sums[bucket] / self._count[bucket]
        elif self._total_count:
            mean = self._total / self._total_count
        else:
            mean = float(self._prior)
        return max(1, min(int(max_tokens), math.ceil(mean)))

    @property
    def observed(self) -> int:
        """Finished requests learnt from."""
        return self._total_count


class EmbeddingLoadForecaster:
    """Arrival rate of embedding blocks, exponentially weighted over `time_constant_s`.

    Args:
        time_constant_s: How quickly old arrivals are forgotten (seconds).
    """

    __slots__ = ("_last_s", "_rate", "_tau")

    def __init__(self, time_constant_s: float = 2.0) -> None:
        if not time_constant_s > 0:
            raise ValueError(f"time_constant_s must be > 0, got {time_constant_s!r}")
        self._tau = float(time_constant_s)
        self._rate = 0.0
        self._last_s: float | None = None

    def _decay(self, now_s: float) -> float:
        if self._last_s is None or now_s <= self._last_s:
            return self._rate
        return self._rate * math.exp(-(now_s - self._last_s) / self._tau)

    def observe(self, now_s: float, blocks: int) -> None:
        """One embedding batch of `blocks` arrived at `now_s`."""
        self._rate = self._decay(now_s) + blocks / self._tau
        self._last_s = now_s if self._last_s is None else max(self._last_s, now_s)

    def rate(self, now_s: float) -> float:
        """Blocks per second arriving around `now_s`."""
        return self._decay(now_s)

    def forecast_blocks(self, now_s: float, horizon_s: float) -> float:
        """Blocks expected to arrive within `horizon_s` of `now_s`."""
        return self.rate(now_s) * max(0.0, horizon_s)
