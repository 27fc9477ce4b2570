"""sage_eviction: KV-cache eviction policies behind one incremental interface.

Pure Python (one optional compiled module), the standard library only: it imports nothing of
`engine_adapter` or `sage_cli` and never torch, not even inside a function; the engine
integrations import their engine lazily (docs/architecture.md, "Layers").

    >>> from sage_eviction import create_policy, EntryMeta
    >>> policy = create_policy("lru")
    >>> policy.insert("a", EntryMeta())
    >>> policy.insert("b", EntryMeta())
    >>> policy.access("a", now=1.0)
    >>> policy.evict(1)
    ['b']

What lives where (docs/architecture.md, "Policy interface"):

- `types`: the records that cross the policy boundary (`EntryMeta`, `PolicyEntry`, the module
  spec's `EvictionCandidate`, `EvictionMetrics`, `EvictionPolicyProtocol` ...).
- `errors`: the exception tree.
- `base`: `EvictionPolicy`, the incremental interface every policy implements, with its two
  mixins: `handover` (the hot-swap handover: `entries`, `from_entries`, bulk loads) and
  `sequence_level` (the module spec's `select_victims`, `update_access`, `get_metrics`).
- `preemption`: the orders over running sequences (`PreemptionOrder`, one table `ORDERS`):
  which sequence a scheduler preempts first; a policy names only its default.
- `recency` and `heap`: the bases most policies build on (O(1) recency queues; scores in a lazy
  heap).
- `policies/`: one file and one class per policy; `registry`: names to classes, entry-point
  plugins and the one reader of policy specs (`resolve_policy`).
- `metrics`: the metric definitions; `flat`: a flat (independent blocks) cache driver,
  exported as `Cache` (``Cache("lru", 1000).request(key)`` is a hit or a miss, as a libCacheSim
  cache's ``get``) with `simulate_flat` over a key sequence.
- `keyset`: the set of evicted keys not yet requested again (`new_key_set`: the compiled
  `KeySet` of int64 keys, or its set-based reference).
- `native` and `_core` (Cython, optional): the compiled score heap, `select_victims`, the
  policies' C operations, the flat cache's loop and its state in C, and the switch between them
  and the pure-Python reference (`native` also lists the compiled modules setup.py builds);
  `compiled_kinds`: the one table of which built-ins run compiled where.
- `integrations/`: sage's policies inside vLLM, SGLang and LMCache.
"""

from __future__ import annotations

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import (
    DuplicateKeyError,
    OfflinePolicyError,
    PolicyConfigError,
    PolicyLoadError,
    PolicyParamError,
    PolicyStateError,
    SageEvictionError,
    UnknownKeyError,
    UnknownPolicyError,
)
from sage_eviction.flat import FlatCache, FlatResult, simulate_flat
from sage_eviction.heap import FlatHeapPolicy, HeapPolicy
from sage_eviction.preemption import PreemptionOrder
from sage_eviction.recency import LevelledRecencyPolicy, RecencyPolicy
from sage_eviction.registry import (
    ENTRY_POINT_GROUP,
    ResolvedPolicy,
    available_policies,
    create_policy,
    describe_policies,
    get_policy_class,
    policy_label,
    policy_params,
    register_policy,
    resolve_policy,
    split_policy_specs,
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
    "Cache",
    "FlatCache",
    "FlatResult",
    "simulate_flat",
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
    "PolicyLoadError",
    "PolicyEntry",
    "PolicyParamError",
    "PolicyStateError",
    "PreemptionOrder",
    "RecencyPolicy",
    "ResolvedPolicy",
    "SageEvictionError",
    "UnknownKeyError",
    "UnknownPolicyError",
    "__version__",
    "available_policies",
    "create_policy",
    "describe_policies",
    "get_policy_class",
    "policy_label",
    "policy_params",
    "register_policy",
    "resolve_policy",
    "split_policy_specs",
]

Cache = FlatCache
"""A policy over independent blocks, driven key by key (`sage_eviction.flat.FlatCache`): the
cache libCacheSim simulates, so its misses are libCacheSim's for the policies both have."""
