"""sage's policy for the host tier of SGLang's HiCache (`UnifiedRadixCache.init_hicache`, 0.5.23).

With `--enable-hierarchical-cache`, a node the device tier evicts after its KV was backed up to
host memory stays in the tree, host-only, and a later prefix match loads it back. When the host
pool is full, `UnifiedRadixCache.evict_host` → `UnifiedTreeCore.drive_host_eviction` →
`FullComponent.drive_host_eviction` picks host leaves (evicted from device, backed up, unlocked,
childless) by the tree's one `EvictionStrategy` key, the same object that orders the device tier:
recency for the default `lru`. `_SageHostTier` replaces that choice with a second sage policy,
its own instance and possibly its own name, fed the host tier's own events, keyed by tree node id:

- a backup lands (`commit_hicache_transfer`, BACKUP_HOST): `insert`;
- a node split copies the host value to the new parent: `insert` of the new parent;
- a prefix match touches nodes holding a host copy (a host hit, or a device hit on a backed-up
  node): `access` of each, root first;
- a host copy freed other than by this policy (`evict_component` on the HOST layer: write-back
  duplicate reclaim, a deleted node): `remove`;
- host pool pressure (`drive_host_eviction`): the evictable flags are synced to the tree's
  `evictable_host_leaves`, then `evict(1)` per victim, which SGLang drops (`_evict_host_leaf`).

Host copies that appear with no component hook (`UnifiedTreeCore.insert_host`, the L3 storage
prefetch) are inserted when they are first seen among the host leaves, counted in
`host_late_inserts`. Write-back's reclaim of host copies whose device copy is live
(`_reclaim_full_host_duplicates`, which frees no data) runs first and keeps SGLang's order.

The policy: `"hicache_policy": "<spec>"` in `--radix-eviction-policy-config`, else
`SAGE_HICACHE_POLICY`, else the device tier's spec (SGLang itself orders both tiers with one
strategy). The mixin sits beside `_SageFullComponent` (`sglang.sage_full_component_class`), whose
`_meta` it shares; it only runs on the Python TreeCore, which the sage component already needs.

The data moves (device↔host copies, pinned memory, copy streams) are SGLang's own and need CUDA;
this module moves no data and was tested on CPU with a stand-in for the copy kernel.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

from sage_eviction.errors import PolicyConfigError
from sage_eviction.integrations.bridge import POLICY_ENV, PolicyBridge, policy_spec_from_env
from sage_eviction.integrations.compat import EngineClass
from sage_eviction.registry import resolve_policy

__all__ = ["HOST_ENGINE", "HOST_POLICY_ENV", "HOST_POLICY_KEY"]

HOST_POLICY_KEY = "hicache_policy"
HOST_POLICY_ENV = "SAGE_HICACHE_POLICY"
HOST_ENGINE = "sglang-hicache"  # the host bridge's name in errors and the event log


class _SageHostTier(EngineClass):  # type: ignore[misc]
    """HiCache host-tier victims chosen by a sage policy (see the module docstring)."""

    sage_spec: ClassVar[str | None] = None
    sage_host_spec: ClassVar[str | None] = None

    def __init__(self, cache: Any, params: Any) -> None:
        super().__init__(cache, params)
        self.host_spec: str | None = (
            self.sage_host_spec
            or policy_spec_from_env(HOST_POLICY_ENV)
            or self.sage_spec
            or policy_spec_from_env(POLICY_ENV)
        )
        if self.host_spec is not None:
            # Checked now, at cache construction, not at the first host backup minutes later.
            try:
                resolve_policy(self.host_spec, None, online=True).build()
            except PolicyConfigError as exc:
                raise type(exc)(f"sage's {HOST_ENGINE} integration: {exc}") from None
        # Built on the first host event: without HiCache there is no host tier to order.
        self._host_bridge: PolicyBridge | None = None
        self._host_nodes: dict[Hashable, Any] = {}
        self.host_late_inserts = 0

    @property
    def sage_host(self) -> PolicyBridge:
        """The host tier's policy bridge (built on first use)."""
        if self._host_bridge is None:
            self._host_bridge = PolicyBridge(self.host_spec, engine=HOST_ENGINE)
        return self._host_bridge

    def _track_host(self, node: Any) -> None:
        if node.component_data[self.component_type].host_value is not None and node.id not in self.sage_host:
            self.sage_host.insert(node.id, self._meta(node), evictable=False)
            self._host_nodes[node.id] = node

    def commit_hicache_transfer(self, node: Any, phase: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.mem_cache.unified_cache.components.base import CacheTransferPhase

        out = super().commit_hicache_transfer(node, phase, *args, **kwargs)
        if phase == CacheTransferPhase.BACKUP_HOST:
            self._track_host(node)
        return out

    def redistribute_on_node_split(self, new_parent: Any, child: Any) -> None:
        super().redistribute_on_node_split(new_parent, child)
        if self._host_bridge is not None:
            self._track_host(new_parent)

    def finalize_match_result_in_tree_core(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().finalize_match_result_in_tree_core(result, *args, **kwargs)
        if self._host_bridge is not None:
            path = []
            node = result.best_match_node
            while node is not None and node is not self.tree_core.root_node:
                if node.id in self._host_bridge:
                    path.append(node.id)
                node = node.parent
            for node_id in reversed(path):  # root first: the deepest node is the most recent
                self._host_bridge.access(node_id)
        return out

    def evict_component(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().evict_component(node, *args, **kwargs)
        host = self._host_bridge
        freed = node.component_data[self.component_type].host_value is None
        if host is not None and freed and node.id in host:
            host.remove(node.id)  # a copy freed by SGLang, not by this policy's choice
            self._host_nodes.pop(node.id, None)
        return out

    def _sync_host_leaves(self, leaves: Any) -> None:
        for node in leaves:
            if node.id not in self.sage_host:  # a host copy no hook announced (storage prefetch)
                self._track_host(node)
                self.host_late_inserts += 1
        for node_id, node in self._host_nodes.items():
            self.sage_host.set_evictable(node_id, node in leaves)

    def drive_host_eviction(
        self, num_tokens: int, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any
    ) -> None:
        """Free `num_tokens` of host pool by dropping host leaves in the host policy's order."""
        tree = self.tree_core
        leaves = tree.evictable_host_leaves
        self._sync_host_leaves(leaves)
        host = self.sage_host
        while tracker[self.component_type] < num_tokens:
            victims = host.evict(1)
            if not victims:
                return
            node = self._host_nodes.pop(victims[0])
            if node not in leaves:  # cannot happen after the sync; the log would show it
                self._track_host(node)
                continue
            host.note("engine_evict", key=node.id)
            ancestor = node.parent
            tree._evict_host_leaf(node, tracker, device_frees, host_frees, cache_actions=cache_actions)
            # The drop may have deleted emptied ancestors too; the first survivor can be a new leaf.
            while ancestor is not None and ancestor is not tree.root_node:
                if ancestor.id in host:
                    host.set_evictable(ancestor.id, ancestor in leaves)
                ancestor = ancestor.parent
