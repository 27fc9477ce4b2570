"""sage's policies inside LMCache: a monkeypatch, because LMCache has no policy registry.

LMCache 0.5.6 picks its policies from two closed factories: the in-process storage backends
(`LocalCPUBackend`, `LocalDiskBackend`) call `cache_policy.get_cache_policy(name)`, a plain dict
`POLICY_MAPPING`; the multi-process server calls `CreateEvictionPolicy(config)`, an if/elif over
four names, imported by name into `eviction_controller`. `install()` (version-checked,
idempotent) adds sage's entries to the first and wraps the second; nothing else is touched.

- In-process: `cache_policy: SAGE` (or `LMCACHE_CACHE_POLICY=SAGE`) runs `SAGE_POLICY`;
  `SAGE_<NAME>` (e.g. `SAGE_S3FIFO`) runs that registry policy with its defaults.
- Multi-process server: an `EvictionConfig` whose `eviction_policy` is `SAGE` or `SAGE_<NAME>`
  builds `sage_eviction_policy_class`. The server's argparse `choices` still refuse those
  names: a launcher must call `install()` and build its config itself (not provided yet).

Inside vLLM (LMCache's in-process connector), sage's `vllm.general_plugins` entry point calls
`install()` when `LMCACHE_CACHE_POLICY` names a sage policy.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Hashable, MutableMapping
from typing import Any, ClassVar

from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.integrations.compat import EngineClass, check_version
from sage_eviction.registry import available_policies, get_policy_class
from sage_eviction.types import EntryMeta

__all__ = ["PREFIX", "install", "sage_cache_policy_class", "sage_eviction_policy_class", "wanted"]

PREFIX = "SAGE"
_log = logging.getLogger("sage_eviction.integrations.lmcache")


def wanted(name: str | None) -> bool:
    """Whether an LMCache policy name asks for a sage policy."""
    return bool(name) and str(name).upper().split("_", 1)[0] == PREFIX


def _policy_of(name: str) -> str | None:
    """`SAGE` -> None (read SAGE_POLICY); `SAGE_S3FIFO` -> "s3fifo"."""
    _, _, rest = name.partition("_")
    return rest.lower() or None


def install() -> None:
    """Add sage's policies to LMCache's two factories (once per process).

    Raises:
        UnsupportedEngineVersion: LMCache is missing or not the tested release.
    """
    check_version("lmcache")
    from lmcache.v1.distributed.storage_controllers import eviction_controller
    from lmcache.v1.storage_backend import cache_policy

    # SAGE_<NAME> for the policies that need no capacity (LMCache counts bytes, not entries);
    # the others run as SAGE with SAGE_POLICY="name:capacity=N".
    names = [p for p in available_policies(include_offline=False) if not get_policy_class(p).needs_capacity]
    for name in [PREFIX, *(f"{PREFIX}_{p.upper()}" for p in names)]:
        cache_policy.POLICY_MAPPING.setdefault(name, sage_cache_policy_class(_policy_of(name)))
    original = eviction_controller.CreateEvictionPolicy
    if getattr(original, "__sage__", False):
        return

    def create_eviction_policy(config: Any) -> Any:
        name = str(config.eviction_policy)
        if wanted(name):
            return sage_eviction_policy_class(_policy_of(name))()
        return original(config)

    create_eviction_policy.__sage__ = True  # type: ignore[attr-defined]
    eviction_controller.CreateEvictionPolicy = create_eviction_policy
    _log.info("sage: LMCache policies %s installed", PREFIX)


class _SageCachePolicy(EngineClass):  # type: ignore[misc]
    """A `BaseCachePolicy` for LMCache's in-process backends running the policy `sage_spec`
    names (None: SAGE_POLICY); a mixin over LMCache's class (`sage_cache_policy_class`).

    The backend owns the entries (a plain dict, as `init_mutable_mapping` returns); the policy
    orders them. A backend pins entries without telling its policy, so a victim whose
    `can_evict` is false is put back and the next one is taken (LMCache's own policies skip
    such entries the same way).
    """

    sage_spec: ClassVar[str | None] = None

    def __init__(self) -> None:
        # LMCache's factory passes no arguments: no capacity (LMCache sizes its cache in
        # bytes, not entries), so policies that need one must be given it in SAGE_POLICY.
        self.sage = PolicyBridge(self.sage_spec, engine="lmcache")
        self._metas: dict[Hashable, EntryMeta] = {}
        # Candidates handed out and not yet seen leaving the cache: the layer-wise path
        # takes only the first of up to 64 and leaves the rest in the cache.
        self._handed_out: list[Hashable] = []

    def init_mutable_mapping(self) -> dict[Hashable, Any]:
        return {}

    def _settle(self, cache_dict: MutableMapping[Hashable, Any]) -> None:
        """Candidates still cached go back to the policy (as new entries with their old
        metadata); the others are gone for good."""
        for key in self._handed_out:
            meta = self._metas.get(key)
            if meta is None:
                continue
            if key in cache_dict:
                self.sage.insert(key, meta, evictable=True)
            else:
                del self._metas[key]
        self._handed_out.clear()

    def update_on_hit(self, key: Hashable, cache_dict: MutableMapping[Hashable, Any]) -> None:
        self._settle(cache_dict)
        self.sage.access(key)

    def update_on_put(self, key: Hashable) -> None:
        now = time.time()
        meta = self._metas[key] = EntryMeta(created_at=now, last_access=now)
        self.sage.insert(key, meta, evictable=True)

    def update_on_force_evict(self, key: Hashable) -> None:
        self._metas.pop(key, None)
        self.sage.remove(key)

    def get_evict_candidates(
        self, cache_dict: MutableMapping[Hashable, Any], num_candidates: int = 1
    ) -> list[Hashable]:
        self._settle(cache_dict)

        def can_evict(key: Hashable) -> bool:
            entry = cache_dict.get(key)
            return entry is not None and bool(entry.can_evict)

        victims = self.sage.evict(num_candidates, eligible=can_evict)
        self._handed_out.extend(victims)
        return victims


@functools.cache
def sage_cache_policy_class(policy: str | None = None) -> type[Any]:
    """A `BaseCachePolicy` for LMCache's in-process backends running `policy` (None: SAGE_POLICY):
    `_SageCachePolicy` over the installed LMCache's class (built once per policy)."""
    from lmcache.v1.storage_backend.cache_policy.base_policy import BaseCachePolicy

    class SageCachePolicy(_SageCachePolicy, BaseCachePolicy):  # type: ignore[misc]
        sage_spec = policy

    SageCachePolicy.__name__ = SageCachePolicy.__qualname__ = f"Sage{(policy or '').upper()}CachePolicy"
    return SageCachePolicy


class _SageEvictionPolicy(EngineClass):  # type: ignore[misc]
    """An `EvictionPolicy` for LMCache's multi-process server running the policy `sage_spec`
    names (None: SAGE_POLICY); a mixin over LMCache's class (`sage_eviction_policy_class`).

    `get_eviction_actions(ratio)` returns about `ratio` of the tracked keys, the policy's
    victims in order, as one action to the first registered destination (else DISCARD).
    """

    sage_spec: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.sage = PolicyBridge(self.sage_spec, engine="lmcache-mp")
        self._destinations: list[Any] = []
        self._metas: dict[Hashable, EntryMeta] = {}
        # Victims handed out in actions not yet confirmed by `on_keys_removed`: LMCache may
        # not carry an action out, and a key it keeps goes back to the policy when seen.
        self._handed_out: set[Hashable] = set()

    @property
    def name(self) -> str:
        return "sage_eviction_policy"

    def register_eviction_destination(self, destination: Any) -> None:
        if destination not in self._destinations:
            self._destinations.append(destination)

    def _back(self, key: Hashable) -> None:
        if key in self._handed_out:
            self._handed_out.discard(key)
            self.sage.insert(key, self._metas[key], evictable=True)

    def on_keys_created(self, keys: list[Hashable]) -> None:
        for key in reversed(keys):  # the order LMCache's LRU records them in
            self._back(key)
            if key in self.sage:
                self.sage.access(key)  # re-created: LMCache's LRU counts it as a use
            else:
                now = time.time()
                meta = self._metas[key] = EntryMeta(created_at=now, last_access=now)
                self.sage.insert(key, meta, evictable=True)

    def on_keys_touched(self, keys: list[Hashable]) -> None:
        for key in reversed(keys):  # a prefix's head ends up the most recent
            self._back(key)
            self.sage.access(key)

    def on_keys_removed(self, keys: list[Hashable]) -> None:
        for key in keys:
            self._handed_out.discard(key)
            self._metas.pop(key, None)
            self.sage.remove(key)

    def get_eviction_actions(
        self,
        expected_ratio: float,
        key_eligible_filter: Callable[[Hashable], bool] | None = None,
        cache_salt: str | None = None,
    ) -> list[Any]:
        from lmcache.v1.distributed.internal_api import EvictionAction, EvictionDestination

        ratio = min(max(expected_ratio, 0.0), 1.0)
        if ratio <= 0 or not len(self.sage):
            return []
        count = max(1, int(len(self.sage) * ratio))  # LMCache's LRU's count
        victims = self.sage.evict(count, eligible=key_eligible_filter)
        if not victims:
            return []
        self._handed_out.update(victims)
        destination = self._destinations[0] if self._destinations else EvictionDestination.DISCARD
        return [EvictionAction(destination=destination, keys=list(victims))]


@functools.cache
def sage_eviction_policy_class(policy: str | None = None) -> type[Any]:
    """An `EvictionPolicy` for LMCache's multi-process server running `policy` (None:
    SAGE_POLICY): `_SageEvictionPolicy` over the installed LMCache's class (built once per
    policy)."""
    from lmcache.v1.distributed.eviction import EvictionPolicy

    class SageEvictionPolicy(_SageEvictionPolicy, EvictionPolicy):  # type: ignore[misc]
        sage_spec = policy

    return SageEvictionPolicy
