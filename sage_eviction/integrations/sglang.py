"""sage's policies inside SGLang's radix cache (`UnifiedRadixCache`, the default in 0.5.23).

SGLang orders device-tier eviction with a stateless `EvictionStrategy.get_priority(node)` key,
so policies with state (ARC, S3-FIFO, SLRU, GDSF's inflation) need to see every insert and hit.
sage therefore runs at the event level: `SageFullComponent` subclasses SGLang's `FullComponent`,
turns its hooks into bridge calls keyed by tree node ids, and chooses each device victim among
the evictable leaves (leaf-only, as SGLang requires). Two ways in, both registered by the
`sglang.srt.plugins` entry point `register()` (it runs in every SGLang process, before argument
parsing):

- `--radix-eviction-policy sage-<name> [--radix-eviction-policy-config '{"k": v}']`: the names
  are added through SGLang's public `add_radix_eviction_policy_choices`; the cache factory then
  installs `SageFullComponent` running `<name>` with those params.
- `--radix-cache-backend sage`: the same component with the policy from `SAGE_POLICY`.

Both need the Python TreeCore: the default Rust core refuses unknown policy names and custom
components, so `register()` sets `SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python` when a sage
policy is asked for (a component override forces it as well). HiCache's host tier keeps
SGLang's own order: the `sage-<name>` strategy object SGLang builds for it is recency (LRU).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Hashable
from typing import Any, ClassVar

from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.integrations.compat import EngineClass, check_version
from sage_eviction.registry import available_policies
from sage_eviction.types import EntryMeta

__all__ = ["PREFIX", "register", "sage_full_component_class", "spec_of"]

PREFIX = "sage-"
BACKEND = "sage"
_log = logging.getLogger("sglang.sage_eviction")


def spec_of(policy: str, config: dict[str, Any] | None) -> str:
    """`sage-s3fifo` with `{"small_ratio": 0.2}` -> `s3fifo:small_ratio=0.2`."""
    name = policy[len(PREFIX) :] if policy.startswith(PREFIX) else policy
    params = ",".join(f"{k}={v}" for k, v in (config or {}).items())
    return f"{name}:{params}" if params else name


def _asks_for_sage(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
        policy_flag = arg.startswith("--radix-eviction-policy") and "-config" not in arg
        if policy_flag and value.startswith(PREFIX):
            return True
        if arg.startswith("--radix-cache-backend") and value == BACKEND:
            return True
    return False


def register() -> None:
    """The `sglang.srt.plugins` entry point (idempotent; once per SGLang process).

    Raises:
        UnsupportedEngineVersion: SGLang is not the tested release.
    """
    check_version("sglang")
    from sglang.srt.arg_groups import choices
    from sglang.srt.mem_cache import registry, utils
    from sglang.srt.mem_cache.evict_policy import LRUStrategy

    names = [f"{PREFIX}{p}" for p in available_policies(include_offline=False)]
    new = [n for n in names if n not in choices.RADIX_EVICTION_POLICY_CHOICES]
    choices.add_radix_eviction_policy_choices(new)
    for name in names:
        # The strategy object SGLang builds for the name: only the host tier (HiCache) and the
        # legacy RadixCache read it; the device tier is SageFullComponent's.
        utils._EVICTION_POLICY_FACTORIES.setdefault(name, lambda **_: LRUStrategy())
    if BACKEND not in registry._RADIX_CACHE_REGISTRY:
        registry.register_radix_cache_backend(BACKEND, _sage_backend_factory)
    if not getattr(registry.default_radix_cache_factory, "__sage__", False):
        registry.default_radix_cache_factory = _wrap_default_factory(registry.default_radix_cache_factory)
    if _asks_for_sage(sys.argv):
        os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")


def _use_sage_component(ctx: Any, spec: str | None) -> None:
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    overrides = dict(ctx.params.component_registry_override or {})
    overrides[ComponentType.FULL] = sage_full_component_class(spec)
    ctx.params.component_registry_override = overrides
    _log.info("sage: the radix cache's device tier evicts with %s (Python TreeCore)", spec or "SAGE_POLICY")


def _sage_backend_factory(ctx: Any) -> Any:
    """`--radix-cache-backend sage`: the default UnifiedRadixCache with sage's Full component."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    _use_sage_component(ctx, None)
    return create_unified_radix_cache(ctx)


def _wrap_default_factory(original: Any) -> Any:
    def default_radix_cache_factory(ctx: Any) -> Any:
        policy = str(ctx.params.eviction_policy or "")
        if policy.startswith(PREFIX):
            _use_sage_component(ctx, spec_of(policy, ctx.params.eviction_policy_config))
            ctx.params.eviction_policy_config = None  # sage's params, not an LRUStrategy's
        return original(ctx)

    default_radix_cache_factory.__sage__ = True  # type: ignore[attr-defined]
    return default_radix_cache_factory


class _SageFullComponent(EngineClass):  # type: ignore[misc]
    """SGLang's `FullComponent` whose device victims are the policy `sage_spec` names (None:
    SAGE_POLICY); a mixin over SGLang's class (`sage_full_component_class`).

    Keys are tree node ids. Hooks: a node gets device KV (`commit_insert_component_data`) →
    `insert`; a prefix match → `access` of each matched node, root first; a split → `insert` of
    the new parent with a copy of the child's metadata; the node leaves the device tier
    (`evict_component`) → `remove` (a no-op for the policy's own victims). At each eviction
    walk the evictable flags are synced to the tree's evictable device leaves.
    """

    sage_spec: ClassVar[str | None] = None

    def __init__(self, cache: Any, params: Any) -> None:
        super().__init__(cache, params)
        self.sage = PolicyBridge(self.sage_spec, engine="sglang")
        self._nodes: dict[Hashable, Any] = {}
        self._last_victim: Any = None

    def _meta(self, node: Any) -> EntryMeta:
        now = time.time()
        return EntryMeta(size=len(node.key), cost=float(len(node.key)), created_at=now, last_access=now)

    def _track(self, node: Any) -> None:
        if node.id not in self.sage and node.component_data[self.component_type].value is not None:
            self.sage.insert(node.id, self._meta(node), evictable=False)
            self._nodes[node.id] = node

    def commit_insert_component_data(self, node: Any, *args: Any, **kwargs: Any) -> None:
        super().commit_insert_component_data(node, *args, **kwargs)
        # The walk may have added the leaf and split a node on the way: track the new ones.
        walk = node
        while walk is not None and walk is not self.tree_core.root_node and walk.id not in self.sage:
            self._track(walk)
            walk = walk.parent

    def redistribute_on_node_split(self, new_parent: Any, child: Any) -> None:
        super().redistribute_on_node_split(new_parent, child)
        self._track(new_parent)

    def finalize_match_result_in_tree_core(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().finalize_match_result_in_tree_core(result, *args, **kwargs)
        path = []
        node = result.last_device_node
        while node is not None and node is not self.tree_core.root_node:
            path.append(node.id)
            node = node.parent
        for node_id in reversed(path):  # root first: the deepest node is the most recent
            self.sage.access(node_id)
        return out

    def evict_component(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().evict_component(node, *args, **kwargs)
        if node.component_data[self.component_type].value is None or node.id in self.sage:
            self.sage.remove(node.id)
            self._nodes.pop(node.id, None)
        return out

    def _evict_device_start(self, request_cnt: int) -> None:
        super()._evict_device_start(request_cnt)  # keeps SGLang's bookkeeping consistent
        self._evict_device_heap: list[Any] = []  # SGLang's heap: not used for device victims
        leaves = self.tree_core.evictable_device_leaves
        for node_id, node in self._nodes.items():
            self.sage.set_evictable(node_id, node in leaves)
        self._last_victim = None

    def _evict_device_next_node(
        self, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any
    ) -> Any:
        leaves = self.tree_core.evictable_device_leaves
        last = self._last_victim
        if last is not None and last.parent is not None and last.parent in leaves:
            self.sage.set_evictable(last.parent.id, True)  # the parent became a leaf
        self._last_victim = None
        if tracker[self.component_type] >= self._evict_device_request_cnt:
            return None
        while True:
            victims = self.sage.evict(1)
            if not victims:
                return None
            node = self._nodes.pop(victims[0], None)
            if node is not None and node in leaves:
                self.sage.note("engine_evict", key=node.id)
                self._last_victim = node
                return node.id


@functools.cache
def sage_full_component_class(spec: str | None = None) -> type[Any]:
    """SGLang's `FullComponent` whose device victims are a sage policy's (None: SAGE_POLICY):
    `_SageFullComponent` over the installed SGLang's class (built once per spec)."""
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

    class SageFullComponent(_SageFullComponent, FullComponent):  # type: ignore[misc]
        sage_spec = spec

    return SageFullComponent
