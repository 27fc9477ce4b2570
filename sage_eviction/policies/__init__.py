"""The built-in policies: one file and one class per policy, registered by name in `POLICIES`."""

from __future__ import annotations

from sage_eviction.base import EvictionPolicy
from sage_eviction.policies.lru import LRUPolicy

# policies: group A (recency, frequency, priority, cost)
# end group A
# policies: group B (adaptive, queue-based, offline)
# end group B

__all__ = [
    "POLICIES",
    "LRUPolicy",
    # names: group A
    # end names group A
    # names: group B
    # end names group B
]

POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRUPolicy,
    # registry: group A
    # end registry group A
    # registry: group B
    # end registry group B
}
