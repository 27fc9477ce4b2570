"""`cache_aware`: sgl-router's cache-aware policy (``sglang-router`` / ``smg --policy cache_aware``).

Per request, as sgl-router's ``CacheAwarePolicy.select_worker`` decides (its source, read for
this; the code here is sage's):

1. Load is each replica's outstanding requests (the router's in-flight count of a worker).
   The fleet is imbalanced when ``max - min > balance_abs_threshold`` and
   ``max > min * balance_rel_threshold``; then the least loaded replica gets the request (and
   the tree still records it there).
2. Otherwise the approximate tree (`ApproxTree`: the prompts the router sent where, never the
   engines' real caches) gives the longest matched prefix and a replica holding it; when the
   matched share of the prompt exceeds `cache_threshold` that replica gets it, else the replica
   with the smallest tree (the most room, as far as the router knows).
3. The prompt is inserted into the tree under the chosen replica; every `eviction_interval`
   seconds (virtual) each replica's part of the tree is cut to `max_tree_size` by LRU leaves.

Defaults as sgl-router's `CacheAwareConfig`: 0.5, 32, 1.1, 30 s, 10000. The unit differs: its
tree holds characters of text, this one block keys (a trace has no text), so `max_tree_size` is
in blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from engine_adapter.sim.fleet.approx_tree import ApproxTree
from engine_adapter.sim.fleet.router import Param, Router

if TYPE_CHECKING:
    from engine_adapter.sim.fleet.replica import Replica
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["CacheAware"]


class CacheAware(Router):
    name = "cache_aware"
    models = "sgl-router (sglang-router, smg) cache_aware; vllm-router cache_aware"
    PARAMS: ClassVar[dict[str, Param]] = {
        "cache_threshold": Param(float, 0.5, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        "balance_abs_threshold": Param(int, 32, lambda v: v >= 0, ">= 0"),
        "balance_rel_threshold": Param(float, 1.1, lambda v: v >= 1.0, ">= 1"),
        "eviction_interval": Param(float, 30.0, lambda v: v > 0, "> 0 (seconds)"),
        "max_tree_size": Param(int, 10000, lambda v: v >= 1, ">= 1 (blocks per replica)"),
    }

    def __init__(self, replicas: Sequence[Replica], **params: Any) -> None:
        super().__init__(replicas, **params)
        self.tree = ApproxTree(len(replicas))
        self._next_eviction = -math.inf
        self.load_balanced = 0  # requests routed by the imbalance rule (sgl-router counts them too)

    def route(self, request: SimRequest, now: float) -> int:
        p = self.params
        if now >= self._next_eviction:
            if self._next_eviction > -math.inf:
                self.tree.evict_to(p["max_tree_size"])
            self._next_eviction = now + p["eviction_interval"]
        keys = request.block_hashes
        loads = [r.outstanding_requests for r in self.replicas]
        high, low = max(loads), min(loads)
        if high - low > p["balance_abs_threshold"] and high > low * p["balance_rel_threshold"]:
            chosen = min(range(len(loads)), key=lambda i: (loads[i], i))
            self.load_balanced += 1
        else:
            matched, tenant = self.tree.prefix_match(keys, now)
            rate = matched / len(keys) if keys else 0.0
            chosen = (
                tenant if tenant is not None and rate > p["cache_threshold"] else self.tree.smallest_tenant()
            )
        self.tree.insert(keys, chosen, now)
        return chosen
