"""One bridge from an engine's cache events to a sage policy's incremental calls.

Engines describe their caches in their own words (vLLM: blocks freed, touched, popped from a
free queue; SGLang: tree nodes inserted, matched, locked; LMCache: keys put, hit, force
evicted). Each integration translates those into the six calls of sage's policy interface
(docs/architecture.md, "Policy interface") through a `PolicyBridge`, keyed by the engine's own
block, node or chunk ids. The bridge:

- builds the policy from the engine's config when it has a field for it, else from
  `SAGE_POLICY=name:k=v,...` (`sage_eviction.registry.resolve_policy`, so names, aliases and
  params are checked exactly as everywhere else in sage);
- tolerates what engines do that sage's strict interface refuses: a key inserted twice
  (an engine replaying its state), an access, flag change or removal of a key it never saw or
  already evicted. These are counted in `BridgeStats.ignored`, not raised, because an engine
  must never fail a request for a bookkeeping mismatch;
- evicts with a protected set and all-or-nothing semantics where an engine needs them;
- optionally writes every call as a JSON line (`SAGE_EVICTION_LOG=path`), so a test, or a
  person debugging a deployment, can replay the engine's cache events through a fresh policy
  and check that every eviction the engine made was the policy's choice.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import asdict, dataclass
from typing import IO, Any

from sage_eviction.base import EvictionPolicy
from sage_eviction.errors import PolicyConfigError
from sage_eviction.registry import resolve_policy
from sage_eviction.types import EntryMeta

__all__ = ["LOG_ENV", "POLICY_ENV", "BridgeStats", "PolicyBridge", "json_key", "policy_spec_from_env"]

POLICY_ENV = "SAGE_POLICY"
LOG_ENV = "SAGE_EVICTION_LOG"


def policy_spec_from_env(var: str = POLICY_ENV) -> str | None:
    """The policy spec in environment variable `var`, or None when it is unset or blank."""
    value = os.environ.get(var, "").strip()
    return value or None


def json_key(key: Hashable) -> Any:
    """A JSON form of an engine key: ints and strings as they are, bytes as hex, else `str`."""
    if isinstance(key, bool) or not isinstance(key, int | str | bytes):
        return str(key)
    return key.hex() if isinstance(key, bytes) else key


@dataclass(slots=True)
class BridgeStats:
    """What the bridge did; `ignored` counts engine events that did not fit the policy's state."""

    inserts: int = 0
    accesses: int = 0
    removes: int = 0
    evictions: int = 0
    evict_calls: int = 0
    refused_evictions: int = 0  # all-or-nothing requests the policy could not satisfy
    ignored: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class PolicyBridge:
    """A sage policy driven by an engine's cache events, keyed by the engine's ids.

    Args:
        spec: `name` or `name:k=v,...`; None reads `env_var`.
        capacity: The engine cache's size in its own units (blocks, chunks), for the
            policies that need it.
        engine: The engine's name, for errors and the event log.
        env_var: Where the spec is read from when `spec` is None.
        log_path: JSON-lines event log; None reads `SAGE_EVICTION_LOG` (unset: no log).
        clock: The time source for `EntryMeta` times and accesses.

    Raises:
        PolicyConfigError: No spec given or found, an unknown policy or param, or an offline
            policy (one that needs the future cannot run in an engine).
    """

    def __init__(
        self,
        spec: str | None = None,
        capacity: int | None = None,
        *,
        engine: str,
        env_var: str = POLICY_ENV,
        log_path: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        chosen = spec if spec and spec.strip() else policy_spec_from_env(env_var)
        if chosen is None:
            raise PolicyConfigError(f"sage's {engine} integration: no policy given; set {env_var}=name:k=v")
        try:
            resolved = resolve_policy(chosen, capacity, online=True)
        except PolicyConfigError as exc:
            raise type(exc)(f"sage's {engine} integration: {exc}") from None
        self.spec = chosen
        self.capacity = capacity
        self.engine = engine
        self._resolved = resolved
        self.policy: EvictionPolicy = resolved.build()
        self._metas: dict[Hashable, EntryMeta] = {}  # for putting back refused victims
        self.stats = BridgeStats()
        self._clock = clock
        # Engines call from one scheduler thread, but LMCache's backends evict from worker
        # threads too: one lock keeps the policy's structures consistent.
        self._lock = threading.RLock()
        path = log_path if log_path is not None else os.environ.get(LOG_ENV) or None
        self._log: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115
        self._log_event("start", spec=chosen, capacity=capacity, policy=resolved.cls.name)

    # ---- events ------------------------------------------------------------------------

    def insert(self, key: Hashable, meta: EntryMeta | None = None, *, evictable: bool = False) -> bool:
        """A new entry; False (and only its flag updated) when the key is already held."""
        with self._lock:
            if key in self.policy:
                self.stats.ignored += 1
                self.set_evictable(key, evictable)
                return False
            if meta is None:
                now = self._clock()
                meta = EntryMeta(created_at=now, last_access=now)
            self.policy.insert(key, meta, evictable=evictable)
            self._metas[key] = meta
            self.stats.inserts += 1
            self._log_event(
                "insert",
                key=json_key(key),
                evictable=evictable,
                size=meta.size,
                cost=meta.cost,
                created_at=meta.created_at,
                last_access=meta.last_access,
                hits=meta.hits,
            )
            return True

    def access(self, key: Hashable, now: float | None = None) -> bool:
        """A hit; False when the key is not held."""
        with self._lock:
            if key not in self.policy:
                self.stats.ignored += 1
                return False
            when = self._clock() if now is None else now
            self.policy.access(key, when)
            self.stats.accesses += 1
            self._log_event("access", key=json_key(key), now=when)
            return True

    def set_evictable(self, key: Hashable, evictable: bool) -> bool:
        """The entry became (non-)evictable; False when the key is not held."""
        with self._lock:
            if key not in self.policy:
                self.stats.ignored += 1
                return False
            if self.policy.is_evictable(key) != evictable:
                self.policy.set_evictable(key, evictable)
                self._log_event("evictable", key=json_key(key), evictable=evictable)
            return True

    def remove(self, key: Hashable) -> EntryMeta | None:
        """The entry left the cache for another reason than this policy's eviction."""
        with self._lock:
            if key not in self.policy:
                self.stats.ignored += 1
                return None
            self.stats.removes += 1
            self._log_event("remove", key=json_key(key))
            self._metas.pop(key, None)
            return self.policy.remove(key)

    def prepare_insert(self, key: Hashable) -> None:
        """The engine is about to make room for missed `key` (ghost-list policies adapt here)."""
        with self._lock:
            self.policy.prepare_insert(key)
            self._log_event("prepare_insert", key=json_key(key))

    def evict(
        self,
        n: int = 1,
        protected: Iterable[Hashable] = (),
        *,
        exact: bool = False,
        eligible: Callable[[Hashable], bool] | None = None,
    ) -> list[Hashable]:
        """Choose and forget up to `n` victims, in the policy's order.

        Args:
            n: How many.
            protected: Keys that must not be chosen this time (their flags are restored).
            exact: All or nothing: when fewer than `n` can be chosen, choose none and change
                nothing (vLLM's `CachePolicy.evict` contract).
            eligible: For engines that pin entries without telling the policy (LMCache): a
                victim it refuses is put back, as a new entry with its old metadata (so a
                recency policy sees it as just used, which a pinned entry is).
        """
        if eligible is not None:
            return self._evict_eligible(n, eligible, protected)
        with self._lock:
            self.stats.evict_calls += 1
            policy = self.policy
            shielded = [k for k in protected if policy.is_evictable(k)]
            if exact and policy.num_evictable - len(shielded) < n:
                self.stats.refused_evictions += 1
                return []
            for key in shielded:
                policy.set_evictable(key, False)
            try:
                victims = policy.evict(n)
            finally:
                for key in shielded:
                    policy.set_evictable(key, True)
            self.stats.evictions += len(victims)
            for key in victims:
                del self._metas[key]
            self._log_event(
                "evict",
                n=n,
                protected=[json_key(k) for k in shielded],
                victims=[json_key(k) for k in victims],
            )
            return victims

    def _evict_eligible(
        self, n: int, eligible: Callable[[Hashable], bool], protected: Iterable[Hashable]
    ) -> list[Hashable]:
        shielded = set(protected)
        if shielded:
            return self._evict_eligible(n, lambda k: k not in shielded and eligible(k), ())
        with self._lock:
            chosen: list[Hashable] = []
            refused: list[tuple[Hashable, EntryMeta]] = []
            policy = self.policy
            while len(chosen) < n and policy.num_evictable:
                (key,) = policy.evict(1)
                meta = self._metas.pop(key)
                if eligible(key):
                    chosen.append(key)
                else:  # back in, out of reach until this call ends
                    refused.append((key, meta))
                    policy.insert(key, meta, evictable=False)
                    self._metas[key] = meta
            for key, _ in refused:
                policy.set_evictable(key, True)
            self.stats.evict_calls += 1
            self.stats.evictions += len(chosen)
            self._log_event(
                "evict_eligible",
                n=n,
                victims=[json_key(k) for k in chosen],
                refused=[json_key(k) for k, _ in refused],
            )
            return chosen

    def clear(self) -> None:
        """Forget every entry (an engine's cache reset): a fresh policy of the same spec."""
        with self._lock:
            self.policy = self._resolved.build()
            self._metas.clear()
            self._log_event("clear")

    # ---- queries -----------------------------------------------------------------------

    def __contains__(self, key: object) -> bool:
        return key in self.policy

    def __len__(self) -> int:
        return len(self.policy)

    def is_evictable(self, key: Hashable) -> bool:
        return self.policy.is_evictable(key)

    @property
    def num_evictable(self) -> int:
        return self.policy.num_evictable

    def describe(self) -> dict[str, Any]:
        """The policy, its spec and the bridge's counters, for logs and stats endpoints."""
        return {"engine": self.engine, "spec": self.spec, **self.policy.describe(), **self.stats.to_dict()}

    def note(self, op: str, **fields: Any) -> None:
        """Write an engine-side event (e.g. the block the engine actually evicted) to the log."""
        self._log_event(op, **fields)

    def _log_event(self, op: str, **fields: Any) -> None:
        if self._log is not None:
            record = {"engine": self.engine, "pid": os.getpid(), "bridge": id(self), "op": op, **fields}
            self._log.write(json.dumps(record) + "\n")
