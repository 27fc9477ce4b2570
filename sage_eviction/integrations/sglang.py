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
policy is asked for (a component override forces it as well). With HiCache
(`--enable-hierarchical-cache`) the host tier's victims are a second sage policy's
(`sglang_hicache._SageHostTier`): `"hicache_policy": "<spec>"` in the policy config, else
`SAGE_HICACHE_POLICY`, else the device tier's spec.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sized
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from sage_eviction.errors import PolicyConfigError
from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.integrations.compat import EngineClass, check_version
from sage_eviction.integrations.sglang_hicache import HOST_POLICY_KEY, _SageHostTier
from sage_eviction.registry import available_policies
from sage_eviction.types import EntryMeta

__all__ = [
    "PREFIX",
    "SageTreeEvents",
    "TreeNode",
    "host_spec_of",
    "register",
    "sage_full_component_class",
    "spec_of",
]

PREFIX = "sage-"
BACKEND = "sage"
_log = logging.getLogger("sglang.sage_eviction")


def spec_of(policy: str, config: dict[str, Any] | None) -> str:
    """`sage-s3fifo` with `{"small_ratio": 0.2}` -> `s3fifo:small_ratio=0.2` (the device tier's
    spec: the `hicache_policy` key is the host tier's, `host_spec_of`)."""
    name = policy[len(PREFIX) :] if policy.startswith(PREFIX) else policy
    params = ",".join(f"{k}={v}" for k, v in (config or {}).items() if k != HOST_POLICY_KEY)
    return f"{name}:{params}" if params else name


def host_spec_of(config: dict[str, Any] | None) -> str | None:
    """The HiCache host tier's spec in the policy config (`{"hicache_policy": "lfu"}`), or None.

    Raises:
        PolicyConfigError: The value is not a spec string.
    """
    value = (config or {}).get(HOST_POLICY_KEY)
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise PolicyConfigError(
            f"sage's sglang integration: {HOST_POLICY_KEY} must be a policy spec string, got {value!r}"
        )
    return value


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
        # The strategy object SGLang builds for the name: only the legacy RadixCache reads it;
        # both tiers of UnifiedRadixCache are SageFullComponent's.
        utils._EVICTION_POLICY_FACTORIES.setdefault(name, lambda **_: LRUStrategy())
    if BACKEND not in registry._RADIX_CACHE_REGISTRY:
        registry.register_radix_cache_backend(BACKEND, _sage_backend_factory)
    if not getattr(registry.default_radix_cache_factory, "__sage__", False):
        registry.default_radix_cache_factory = _wrap_default_factory(registry.default_radix_cache_factory)
    if _asks_for_sage(sys.argv):
        os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")


def _use_sage_component(ctx: Any, spec: str | None, host_spec: str | None = None) -> None:
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    overrides = dict(ctx.params.component_registry_override or {})
    overrides[ComponentType.FULL] = sage_full_component_class(spec, host_spec)
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
            config = ctx.params.eviction_policy_config
            _use_sage_component(ctx, spec_of(policy, config), host_spec_of(config))
            ctx.params.eviction_policy_config = None  # sage's params, not an LRUStrategy's
        return original(ctx)

    default_radix_cache_factory.__sage__ = True  # type: ignore[attr-defined]
    return default_radix_cache_factory


_Self = TypeVar("_Self", bound="TreeNode")


class TreeNode(Protocol):
    """What `SageTreeEvents` reads of a radix tree node (SGLang's `TreeNode`, the simulator's
    `sglang_radix.RadixNode`)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> Sized: ...
    @property
    def parent(self: _Self) -> _Self | None: ...


N = TypeVar("N", bound=TreeNode)


class SageTreeEvents(Generic[N]):
    """The event mapping: SGLang's radix-tree events as `PolicyBridge` calls keyed by node id.

    Written once, engine-free, and called both by `_SageFullComponent` inside SGLang and by the
    simulator's SGLang twin (`engine_adapter.sim.twins.sglang_radix`), so that the twin predicts
    what the component does by running the same code:

    - a node gets KV: a new leaf of an insert and the nodes above it not yet tracked (`track_up`,
      leaf first), a split's new parent (`track`) -> ``insert``, not evictable yet;
    - a prefix match (`matched`) -> ``access`` of every node of its path, the root's child first;
    - a node leaves the tier for another reason than the policy's choice (`removed`) -> ``remove``;
    - an eviction walk: `start` sets every tracked node's flag to "is an evictable leaf" (in the
      order the nodes were tracked), then `next_victim` takes the policy's victims one at a time,
      first flagging the previous victim's parent when that left it an evictable leaf (`settle`).

    Args:
        bridge: The policy.
        clock: Times for the entries' metadata (SGLang's: the wall clock; the twin's: its own).
        is_root: Whether a node is the tree's root (never tracked).
        holds_kv: Whether a node holds KV in this tier (SGLang: its component value is set);
            a node without is not tracked.
    """

    def __init__(
        self,
        bridge: PolicyBridge,
        clock: Callable[[], float],
        is_root: Callable[[N], bool],
        holds_kv: Callable[[N], bool] | None = None,
    ) -> None:
        self.bridge = bridge
        self.nodes: dict[Hashable, N] = {}  # tracked, in the order they were tracked
        self._clock = clock
        self._is_root = is_root
        self._holds_kv = holds_kv
        self._last: N | None = None  # the walk's previous victim

    def meta(self, node: N) -> EntryMeta:
        """A node's entry: its tokens as size and cost, created and accessed now."""
        now = self._clock()
        size = len(node.key)
        return EntryMeta(size=size, cost=float(size), created_at=now, last_access=now)

    def track(self, node: N) -> None:
        """`node` holds KV now (a split's new parent, a HiCache load-back, a step of `track_up`)."""
        if node.id not in self.bridge and (self._holds_kv is None or self._holds_kv(node)):
            self.bridge.insert(node.id, self.meta(node), evictable=False)
            self.nodes[node.id] = node

    def track_up(self, leaf: N) -> None:
        """An insert gave `leaf` its KV: it and the untracked nodes above it, leaf first (the walk
        may have split a node on the way)."""
        walk: N | None = leaf
        while walk is not None and not self._is_root(walk) and walk.id not in self.bridge:
            self.track(walk)
            walk = walk.parent

    def matched(self, node: N | None) -> None:
        """A match ended at `node`: every node of its path is accessed, the root's child first
        (the deepest node is the most recent)."""
        path: list[Hashable] = []
        walk = node
        while walk is not None and not self._is_root(walk):
            path.append(walk.id)
            walk = walk.parent
        for node_id in reversed(path):
            self.bridge.access(node_id)

    def removed(self, node: N) -> None:
        """`node` left the tier (a no-op for the policy's own victims, already gone)."""
        if node.id in self.bridge:
            self.bridge.remove(node.id)
            self.nodes.pop(node.id, None)

    def start(self, leaves: Mapping[N, None] | set[N]) -> None:
        """An eviction walk begins: the flags follow the tree's evictable leaves."""
        for node_id, node in self.nodes.items():
            self.bridge.set_evictable(node_id, node in leaves)
        self._last = None

    def settle(self, leaves: Mapping[N, None] | set[N]) -> None:
        """The previous victim's parent, left an evictable leaf, becomes evictable."""
        last, self._last = self._last, None
        if last is not None and last.parent is not None and last.parent in leaves:
            self.bridge.set_evictable(last.parent.id, True)

    def next_victim(self, leaves: Mapping[N, None] | set[N]) -> N | None:
        """The policy's next victim among `leaves` (None: none left)."""
        self.settle(leaves)
        while True:
            victims = self.bridge.evict(1)
            if not victims:
                return None
            node = self.nodes.pop(victims[0], None)
            if node is not None and node in leaves:
                self._last = node
                return node


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
        self.sage_events: SageTreeEvents[Any] = SageTreeEvents(
            self.sage,
            time.time,
            is_root=lambda node: node is self.tree_core.root_node,
            holds_kv=lambda node: node.component_data[self.component_type].value is not None,
        )
        self._nodes = self.sage_events.nodes

    def _meta(self, node: Any) -> EntryMeta:
        """A node's entry (the HiCache host tier's too, `_SageHostTier`)."""
        return self.sage_events.meta(node)

    def commit_insert_component_data(self, node: Any, *args: Any, **kwargs: Any) -> None:
        super().commit_insert_component_data(node, *args, **kwargs)
        self.sage_events.track_up(node)

    def redistribute_on_node_split(self, new_parent: Any, child: Any) -> None:
        super().redistribute_on_node_split(new_parent, child)
        self.sage_events.track(new_parent)

    def finalize_match_result_in_tree_core(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().finalize_match_result_in_tree_core(result, *args, **kwargs)
        self.sage_events.matched(result.last_device_node)
        return out

    def evict_component(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer

        out = super().evict_component(node, *args, **kwargs)
        # Only a device-layer eviction leaves the device tier (the value itself is cleared later,
        # in SGLang's cascade); HiCache also frees host copies alone (write-back reclaim).
        if EvictLayer.DEVICE in kwargs.get("target", EvictLayer.DEVICE):
            self.sage_events.removed(node)
        return out

    def commit_hicache_transfer(self, node: Any, phase: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.mem_cache.unified_cache.components.base import CacheTransferPhase

        out = super().commit_hicache_transfer(node, phase, *args, **kwargs)
        if phase == CacheTransferPhase.LOAD_BACK:  # HiCache: host hits back on device
            for node_id in _loaded_node_ids(args, kwargs):
                self.sage_events.track(self.tree_core.node_by_id(node_id))
        return out

    def _evict_device_start(self, request_cnt: int) -> None:
        super()._evict_device_start(request_cnt)  # keeps SGLang's bookkeeping consistent
        self._evict_device_heap: list[Any] = []  # SGLang's heap: not used for device victims
        self.sage_events.start(self.tree_core.evictable_device_leaves)

    def _evict_device_next_node(
        self, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any
    ) -> Any:
        leaves = self.tree_core.evictable_device_leaves
        self.sage_events.settle(leaves)  # before the stop: the last victim's parent is a leaf now
        if tracker[self.component_type] >= self._evict_device_request_cnt:
            return None
        node = self.sage_events.next_victim(leaves)
        if node is None:
            return None
        self.sage.note("engine_evict", key=node.id)
        return node.id


def _loaded_node_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The nodes a LOAD_BACK commit put back on device (`transfers[0].nodes_to_load`)."""
    transfers = args[0] if args else kwargs.get("transfers", ())
    if not transfers or transfers[0].device_indices is None:
        return []
    return list(transfers[0].nodes_to_load or ())


@functools.cache
def sage_full_component_class(spec: str | None = None, host_spec: str | None = None) -> type[Any]:
    """SGLang's `FullComponent` whose device victims are sage policy `spec`'s (None:
    SAGE_POLICY) and whose HiCache host victims are `host_spec`'s (None: SAGE_HICACHE_POLICY,
    else the device spec): `_SageFullComponent` and `_SageHostTier` over the installed SGLang's
    class (built once per pair)."""
    from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

    class SageFullComponent(_SageFullComponent, _SageHostTier, FullComponent):  # type: ignore[misc]
        sage_spec = spec
        sage_host_spec = host_spec

    return SageFullComponent
