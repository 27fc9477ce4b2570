"""`SageTreeEvents`, the SGLang integration's event mapping, driven without SGLang: the parts
the simulator's twin does not reach (a node without KV in the tier, a node leaving the tier
for another reason than the policy's choice) and the twin's use of the same object."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_adapter.sim.twins.sglang_radix import SGLangRadixTree
from sage_eviction.integrations.bridge import PolicyBridge
from sage_eviction.integrations.sglang import SageTreeEvents, _SageFullComponent
from sage_eviction.integrations.sglang_hicache import _SageHostTier


@dataclass(eq=False)
class Node:
    id: int
    key: tuple[int, ...]
    parent: Node | None
    has_kv: bool = True
    children: list[Node] = field(default_factory=list)


def _events(spec: str = "fifo") -> SageTreeEvents[Node]:
    bridge = PolicyBridge(spec, engine="test", log_path="", clock=lambda: 0.0)
    return SageTreeEvents(bridge, lambda: 0.0, is_root=lambda n: n.id == 0, holds_kv=lambda n: n.has_kv)


def test_a_node_without_kv_is_not_tracked_and_the_walk_goes_on_above_it() -> None:
    root = Node(0, (), None)
    a = Node(1, (1, 2), root)
    b = Node(2, (3,), a, has_kv=False)  # e.g. evicted from the device, kept on the host
    c = Node(3, (4, 5, 6), b)
    events = _events()
    events.track_up(c)
    assert list(events.nodes) == [3, 1] and 2 not in events.bridge
    events.start({c: None})
    assert events.next_victim({c: None}) is c
    assert events.next_victim({c: None}) is None  # a is tracked but not an evictable leaf


def test_a_removed_node_leaves_the_policy_and_a_victim_parent_is_flagged_once_a_leaf() -> None:
    root = Node(0, (), None)
    a = Node(1, (1,), root)
    b = Node(2, (2,), a)
    c = Node(3, (3,), root)
    events = _events()
    for leaf in (b, c):
        events.track_up(leaf)
    events.removed(c)
    assert 3 not in events.bridge and 3 not in events.nodes
    events.removed(c)  # again: a no-op
    leaves: dict[Node, None] = {b: None}
    events.start(leaves)
    assert events.next_victim(leaves) is b
    del leaves[b]
    leaves[a] = None  # b's eviction left a a leaf: flagged before the next choice
    assert events.next_victim(leaves) is a
    assert not events.nodes


def test_the_sglang_twin_chooses_victims_through_the_integrations_mapping() -> None:
    tree = SGLangRadixTree(1, "sage-lru")
    assert isinstance(tree._sage, SageTreeEvents)
    tree.insert(list("ab"))
    tree.insert(list("cd"))
    tree.match_prefix(list("ab"))
    assert [n.id for n in tree._sage.nodes.values()] == [2, 3]
    assert tree.evict(1)[0].path() == tuple("cd")


def test_the_component_mixins_have_what_they_call_on_each_other() -> None:
    """SGLang's `FullComponent` is not installed here: a stand-in base with the attributes the
    mixins read checks that the device tier (the mapping's owner) still gives the host tier its
    entries (`_meta`), and that the component's events reach its bridge."""

    class _Base:
        def __init__(self, cache: object, params: object) -> None:
            self.component_type = "full"
            self.tree_core = type("Core", (), {"root_node": Node(0, (), None)})()

        def commit_insert_component_data(self, node: object, *args: object, **kwargs: object) -> None:
            pass

    class Component(_SageFullComponent, _SageHostTier, _Base):
        sage_spec = "lru"
        sage_host_spec = "lru"

    full = Component(None, None)
    leaf = Node(1, (1, 2, 3), full.tree_core.root_node)
    assert full._meta(leaf).size == 3 and full._meta(leaf).cost == 3.0
    full.sage_events._holds_kv = None  # the stand-in's nodes carry no component data
    full.commit_insert_component_data(leaf)
    assert 1 in full.sage and full._nodes == {1: leaf}
