"""Token-level KV eviction (spec 002): shrink a running sequence's own cache, keeping what matters.

Block-level eviction (`sage_eviction`, `engine_adapter.cache`) drops whole cached prefixes
between requests; token-level eviction compacts one sequence's K/V in the paged pool when memory
runs short or a request asks for it, so a long generation survives on a small pool.

    policies.py   TokenEvictionPolicy (should_evict / evict / name) and none, sliding, snapkv,
                  h2o, tova; the scoring functions, tensor in, tensor out (kvpress's semantics)
    sequence_kv.py SequenceKV: the spec's KVCache view of one sequence in the pool (compaction)
    pressure.py   SystemMonitor (/proc/meminfo, CUDA, the pool) and TokenCacheManager.maybe_evict

This module is torch-free (it only names the policies) so that configs and the CLI can check a
name without importing torch; the submodules import torch.
"""

from __future__ import annotations

__all__ = ["DEFAULT_EVICTION_WINDOW", "DEFAULT_MEMORY_THRESHOLD_MB", "TOKEN_POLICY_NAMES"]

TOKEN_POLICY_NAMES = ("none", "sliding", "snapkv", "h2o", "tova")
"""Names of the token-level policies (``--token-eviction``); ``none`` changes nothing."""

DEFAULT_EVICTION_WINDOW = 1024
"""The spec's ``--eviction-window``: tokens a sliding window keeps after its sinks."""

DEFAULT_MEMORY_THRESHOLD_MB = 256
"""The spec's ``--memory-threshold``: compress when less than this many MB are available."""
