"""The batch size reacts to eviction: the module spec's `SchedulerOptimizer.adjust_batch_size`.

The spec::

    if metrics.re_prefill_rate > 0.3:   return max(1, current_batch_size // 2)
    if metrics.total_evictions < 10:    return min(128, current_batch_size * 2)
    return current_batch_size

Here the metrics are those of the last window of `window` scheduler steps (not totals since
start, which would freeze the decision once the first ten evictions happened): the re-prefill
rate is blocks requested again after their eviction / blocks evicted in the window, as the
cache's `re_prefill_rate` counts it over the whole run. The ceiling is the configured
`max_num_seqs` (the spec's 128 is its own default); the floor is 1.

Why it helps: under memory pressure a large running batch holds many blocks, so the prefix
cache's blocks are evicted and then recomputed (re-prefill) when their prefix comes back;
a smaller batch leaves room for them. When evictions become rare the batch grows back.

Both the engine's scheduler and the simulator use the same `AdaptiveBatch`; every change is a
`BatchChange` they log and export (``sage:max_running_batch``, ``sage:batch_changes_total``).
Pure Python: no torch; imports nothing of the cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "DEFAULT_RARE_EVICTIONS",
    "DEFAULT_RE_PREFILL_THRESHOLD",
    "DEFAULT_WINDOW_STEPS",
    "AdaptiveBatch",
    "BatchChange",
]

DEFAULT_RE_PREFILL_THRESHOLD = 0.3  # the spec's constant
DEFAULT_RARE_EVICTIONS = 10  # the spec's constant: fewer evictions than this is "rare"
DEFAULT_WINDOW_STEPS = 32  # scheduler steps per decision


@dataclass(frozen=True, slots=True)
class BatchChange:
    """One change of the running batch limit.

    Attributes:
        step: The scheduler step count at the decision.
        old: The limit before.
        new: The limit after.
        re_prefill_rate: Re-prefilled / evicted blocks in the window.
        evictions: Blocks evicted in the window.
        reason: ``"re-prefill"`` (shrink) or ``"rare-evictions"`` (grow).
    """

    step: int
    old: int
    new: int
    re_prefill_rate: float
    evictions: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AdaptiveBatch:
    """The running-batch limit, adjusted every `window` steps from eviction counters.

    Args:
        max_batch: The ceiling and the starting limit (the configured ``max_num_seqs``).
        threshold: Shrink when re-prefilled / evicted blocks in a window exceeds this.
        rare_evictions: Grow when fewer blocks than this were evicted in a window.
        window: Steps between decisions.

    Raises:
        ValueError: A limit or window below 1, or a threshold outside [0, 1].
    """

    def __init__(
        self,
        max_batch: int,
        *,
        threshold: float = DEFAULT_RE_PREFILL_THRESHOLD,
        rare_evictions: int = DEFAULT_RARE_EVICTIONS,
        window: int = DEFAULT_WINDOW_STEPS,
    ) -> None:
        if max_batch < 1 or window < 1 or rare_evictions < 0:
            raise ValueError("max_batch and window must be at least 1, rare_evictions at least 0")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold={threshold} must be in [0, 1]")
        self.ceiling = max_batch
        self.current = max_batch
        self.threshold = threshold
        self.rare_evictions = rare_evictions
        self.window = window
        self.steps = 0
        self.shrinks = 0
        self.grows = 0
        self.changes: deque[BatchChange] = deque(maxlen=256)
        self._next_decision = window
        self._evictions = 0  # the counters at the start of the window
        self._re_prefills = 0

    @property
    def next_decision(self) -> int:
        """The step count (`steps`) at which `observe` next decides: until then a call only adds
        its steps up (the simulator's compiled loop calls it only then)."""
        return self._next_decision

    def observe(self, evictions_total: int, re_prefills_total: int, steps: int = 1) -> BatchChange | None:
        """`steps` more steps ran; the cache's counters are now these. Returns the change made
        at the end of a window, if any."""
        self.steps += steps
        if self.steps < self._next_decision:
            return None
        self._next_decision = self.steps + self.window
        evicted = evictions_total - self._evictions
        re_prefilled = re_prefills_total - self._re_prefills
        self._evictions, self._re_prefills = evictions_total, re_prefills_total
        rate = re_prefilled / evicted if evicted > 0 else 0.0
        old = self.current
        if rate > self.threshold:
            new, reason = max(1, old // 2), "re-prefill"
        elif evicted < self.rare_evictions:
            new, reason = min(self.ceiling, old * 2), "rare-evictions"
        else:
            return None
        if new == old:
            return None
        self.current = new
        if new < old:
            self.shrinks += 1
        else:
            self.grows += 1
        change = BatchChange(self.steps, old, new, rate, evicted, reason)
        self.changes.append(change)
        return change
