"""sage_eviction: KV-cache eviction policies behind one incremental interface.

Pure Python; imports nothing from the engine or the CLI and never imports torch.

    >>> from sage_eviction import create_policy, EntryMeta
    >>> policy = create_policy("lru")
    >>> policy.insert("a", EntryMeta())
    >>> policy.insert("b", EntryMeta())
    >>> policy.access("a", now=1.0)
    >>> policy.evict(1)
    ['b']
"""

from __future__ import annotations

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import (
    DuplicateKeyError,
    OfflinePolicyError,
    PolicyConfigError,
    PolicyParamError,
    PolicyStateError,
    SageEvictionError,
    UnknownKeyError,
    UnknownPolicyError,
)
from sage_eviction.heap import FlatHeapPolicy, HeapPolicy
from sage_eviction.recency import LevelledRecencyPolicy, RecencyPolicy
from sage_eviction.registry import (
    ENTRY_POINT_GROUP,
    ResolvedPolicy,
    available_policies,
    create_policy,
    get_policy_class,
    policy_params,
    resolve_policy,
)
from sage_eviction.types import (
    EntryMeta,
    EvictionCandidate,
    EvictionMetrics,
    EvictionPolicyProtocol,
    EvictionResult,
    EvictionStrategy,
    PolicyEntry,
)

__version__ = "0.1.0"

__all__ = [
    "ENTRY_POINT_GROUP",
    "DuplicateKeyError",
    "EntryMeta",
    "EvictionCandidate",
    "EvictionMetrics",
    "EvictionPolicy",
    "EvictionPolicyProtocol",
    "EvictionResult",
    "EvictionStrategy",
    "FlatHeapPolicy",
    "HeapPolicy",
    "LevelledRecencyPolicy",
    "OfflinePolicyError",
    "PolicyConfigError",
    "PolicyEntry",
    "PolicyParamError",
    "PolicyStateError",
    "RecencyPolicy",
    "ResolvedPolicy",
    "SageEvictionError",
    "UnknownKeyError",
    "UnknownPolicyError",
    "__version__",
    "available_policies",
    "create_policy",
    "get_policy_class",
    "policy_params",
    "resolve_policy",
]
