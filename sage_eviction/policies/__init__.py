"""The built-in policies: one file and one class per policy, registered by name in `POLICIES`.

Families, in the registry's order: recency and insertion order (lru, mru, fifo, filo),
frequency, priority and cost (lfu, priority, predictive, slo, gdsf), adaptive queues with
history (arc, slru, s3fifo, sieve, mq), the learned one (reuse), and the offline optimum (belady).
"""

from __future__ import annotations

from sage_eviction.base import EvictionPolicy
from sage_eviction.policies.arc import ARCPolicy
from sage_eviction.policies.belady import BeladyPolicy
from sage_eviction.policies.fifo import FIFOPolicy
from sage_eviction.policies.filo import FILOPolicy
from sage_eviction.policies.gdsf import GDSFPolicy
from sage_eviction.policies.lfu import LFUPolicy
from sage_eviction.policies.lru import LRUPolicy
from sage_eviction.policies.mq import MQPolicy
from sage_eviction.policies.mru import MRUPolicy
from sage_eviction.policies.predictive import PredictivePolicy
from sage_eviction.policies.priority import PriorityPolicy
from sage_eviction.policies.reuse import ReusePolicy
from sage_eviction.policies.s3fifo import S3FIFOPolicy
from sage_eviction.policies.sieve import SIEVEPolicy
from sage_eviction.policies.slo import SLOPolicy
from sage_eviction.policies.slru import SLRUPolicy

__all__ = [
    "POLICIES",
    "ARCPolicy",
    "BeladyPolicy",
    "FIFOPolicy",
    "FILOPolicy",
    "GDSFPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "MQPolicy",
    "MRUPolicy",
    "PredictivePolicy",
    "PriorityPolicy",
    "ReusePolicy",
    "S3FIFOPolicy",
    "SIEVEPolicy",
    "SLOPolicy",
    "SLRUPolicy",
]

POLICIES: dict[str, type[EvictionPolicy]] = {
    # recency and insertion order
    "lru": LRUPolicy,
    "mru": MRUPolicy,
    "fifo": FIFOPolicy,
    "filo": FILOPolicy,
    # frequency, priority and cost
    "lfu": LFUPolicy,
    "priority": PriorityPolicy,
    "predictive": PredictivePolicy,
    "slo": SLOPolicy,
    "gdsf": GDSFPolicy,
    # adaptive queues with history
    "arc": ARCPolicy,
    "slru": SLRUPolicy,
    "s3fifo": S3FIFOPolicy,
    "sieve": SIEVEPolicy,
    "mq": MQPolicy,
    # learnt online from the radix features
    "reuse": ReusePolicy,
    # the offline optimum (simulation only)
    "belady": BeladyPolicy,
}
