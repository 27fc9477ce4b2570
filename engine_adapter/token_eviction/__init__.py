"""Token-level KV eviction (spec 002): shrink a running sequence's own cache, keeping what matters.

Block-level eviction (`sage_eviction`, `engine_adapter.cache`) drops whole cached prefixes
between requests; token-level eviction compacts one sequence's K/V in the paged pool when memory
runs short or a request asks for it, so a long generation survives on a small pool.

    registry.py    TOKEN_POLICIES (name -> ``module:Class``), the entry-point group
                   ``sage.token_policies``, token_policy_names, make_token_policy, the errors
    presses/       one policy per file over presses/base.py (TokenEvictionPolicy, kept_for_ratio,
                   top_kept): none, sliding, snapkv, h2o, tova, knorm, keydiff, leverage,
                   compactor, expected_attention, each with its score function, and the
                   budget wrappers adakv and pyramid
    sequence_kv.py SequenceKV: the spec's KVCache view of one sequence in the pool (compaction)
    pressure.py    SystemMonitor (/proc/meminfo, CUDA, the pool) and TokenCacheManager.maybe_evict
    generate.py    one sequence prefilled, compressed once and decoded (kvpress tests, benchmark)

This module and `registry.py` are torch-free (they name the policies; the request's
`KVCompression` checks its policy against the registry) so that configs and the CLI can check a
name without importing torch; the other modules import torch and the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.token_eviction.registry import (
    UnknownTokenPolicyError,
    parse_token_spec,
    token_policy_names,
)

__all__ = [
    "DEFAULT_EVICTION_WINDOW",
    "DEFAULT_MEMORY_THRESHOLD_MB",
    "DEFAULT_TARGET_RATIO",
    "KVCompression",
]

DEFAULT_EVICTION_WINDOW = 1024
"""The spec's ``--eviction-window``: tokens a sliding window keeps after its sinks."""

DEFAULT_MEMORY_THRESHOLD_MB = 256
"""The spec's ``--memory-threshold``: compress when less than this many MB are available."""

DEFAULT_TARGET_RATIO = 0.5
"""The spec's ``target_ratio``: memory pressure shrinks a sequence to this fraction of its tokens."""


@dataclass(frozen=True, slots=True)
class KVCompression:
    """A request's ``kv_compression``: compress its prompt once after prefill.

    Attributes:
        policy: A token policy other than ``none``: its name, or a spec with params
            (``adakv:snapkv``, ``knorm``, ``compactor:chunk_size=128``; `parse_token_spec`).
        ratio: Fraction of the prompt's tokens removed, in ``[0, 1)`` (kvpress's
            ``compression_ratio``: 0.5 keeps half).
    """

    policy: str
    ratio: float

    def __post_init__(self) -> None:
        names = [n for n in token_policy_names() if n != "none"]  # `none` compresses nothing
        try:
            name = parse_token_spec(self.policy)[0] if isinstance(self.policy, str) else None
        except UnknownTokenPolicyError:
            name = None
        if name not in names:
            listing = ", ".join(names)
            raise UnknownTokenPolicyError(f"kv_compression.policy {self.policy!r} is not one of {listing}")
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, int | float)
            or not 0.0 <= self.ratio < 1.0
        ):
            raise ValueError(f"kv_compression.ratio {self.ratio!r} must be a number in [0, 1)")
