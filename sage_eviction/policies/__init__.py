"""The built-in policies: one file and one class per policy, registered by name in `POLICIES`."""

from __future__ import annotations

from sage_eviction.base import EvictionPolicy
from sage_eviction.policies.lru import LRUPolicy

# policies: group A (recency, frequency, priority, cost)
# isort: off
from sage_eviction.policies.fifo import FIFOPolicy
from sage_eviction.policies.filo import FILOPolicy
from sage_eviction.policies.gdsf import GDSFPolicy
from sage_eviction.policies.lfu import LFUPolicy
from sage_eviction.policies.mru import MRUPolicy
from sage_eviction.policies.predictive import PredictivePolicy
from sage_eviction.policies.priority import PriorityPolicy
from sage_eviction.policies.slo import SLOPolicy

# isort: on
# end group A
# policies: group B (adaptive, queue-based, offline)
# isort: off
from sage_eviction.policies.arc import ARCPolicy
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.policies.s3fifo import S3FIFOPolicy
from sage_eviction.policies.sieve import SIEVEPolicy
from sage_eviction.policies.slru import SLRUPolicy
# isort: on
# end group B

__all__ = [
    "POLICIES",
    "LRUPolicy",
    # names: group A
    "FIFOPolicy",
    "FILOPolicy",
    "GDSFPolicy",
    "LFUPolicy",
    "MRUPolicy",
    "PredictivePolicy",
    "PriorityPolicy",
    "SLOPolicy",
    # end names group A
    # names: group B
    "ARCPolicy",
    "BeladyPolicy",
    "S3FIFOPolicy",
    "SIEVEPolicy",
    "SLRUPolicy",
    # end names group B
]

POLICIES: dict[str, type[EvictionPolicy]] = {
    "lru": LRUPolicy,
    # registry: group A
    "mru": MRUPolicy,
    "fifo": FIFOPolicy,
    "filo": FILOPolicy,
    "lfu": LFUPolicy,
    "priority": PriorityPolicy,
    "predictive": PredictivePolicy,
    "slo": SLOPolicy,
    "gdsf": GDSFPolicy,
    # end registry group A
    # registry: group B
    "arc": ARCPolicy,
    "slru": SLRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "sieve": SIEVEPolicy,
    "belady": BeladyPolicy,
    # end registry group B
}
