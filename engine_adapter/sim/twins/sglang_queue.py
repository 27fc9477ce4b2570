"""SGLang's queue orders (``--schedule-policy``) over the model's tree: which waiting request
is admitted first, and the matches SGLang makes to decide it (they refresh the tree).

As SGLang 0.5.23's `SchedulePolicy.calc_priority` (managers/schedule_policy.py) runs them; the
rules are in sglang_model.py's docstring. Keys are pages (one block key per page), so SGLang's
token thresholds compare against whole pages of tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

from engine_adapter.sim.model_names import SCHEDULE_POLICIES
from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.twins.sglang_radix import RadixNode, SGLangRadixTree

__all__ = ["SCHEDULE_POLICIES", "QueueOrder"]


_MATCH_MAX = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX: lpm turns to fcfs past this many waiting
_REFRESH_INTERVAL = 32  # WAITING_PREFIX_REFRESH_INTERVAL: fcfs refreshes every 32nd round
_IN_BATCH_CHECK = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD (tokens)
_IN_BATCH_DEPRIORITIZE = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD (tokens)


class QueueOrder:
    """One SGLang scheduler's queue order over `tree`.

    Args:
        tree: The model's radix tree (matched as SGLang matches its own).
        policy: One of `SCHEDULE_POLICIES`.
        block_size: Tokens per page.

    Raises:
        ValueError: A policy the model does not have.
    """

    def __init__(self, tree: SGLangRadixTree, policy: str, block_size: int) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"unknown schedule policy {policy!r}; the sglang model has: {', '.join(SCHEDULE_POLICIES)}"
            )
        self.tree = tree
        self.policy = policy
        self.block_size = block_size
        self._refresh_rounds = 0

    def _prompt_pages(self, seq: SimSequence) -> Sequence[Hashable]:
        """The prompt's whole pages: what SGLang's page-aligned match can find."""
        return seq.keys[: min(len(seq.keys), seq.request.input_len // self.block_size)]

    def order(self, waiting: deque[SimSequence]) -> None:
        """Reorder `waiting` in place for this round of admission (queue not empty)."""
        if self.policy == "fcfs" or (self.policy == "lpm" and len(waiting) > _MATCH_MAX):
            self._refresh(waiting)
            return
        matches = [self.tree.match_prefix(self._prompt_pages(seq)) for seq in waiting]
        if self.policy == "lpm":
            ordered = self._longest_prefix(list(waiting), [m.length for m in matches])
        else:
            ordered = [waiting[i] for i in _dfs_weight_order(self.tree.root, [m.node for m in matches])]
        waiting.clear()
        waiting.extend(ordered)

    def _refresh(self, waiting: deque[SimSequence]) -> None:
        """fcfs: every 32nd round under the lru strategy, the first 128 waiting prompts are
        matched, last first (the head ends the most recent)."""
        if self.tree.eviction_policy != "lru":
            return
        due = self._refresh_rounds % _REFRESH_INTERVAL == 0
        self._refresh_rounds += 1
        if due:
            for seq in reversed(list(waiting)[:_MATCH_MAX]):
                self.tree.match_prefix(self._prompt_pages(seq))

    def _longest_prefix(self, waiting: list[SimSequence], matched_pages: list[int]) -> list[SimSequence]:
        """lpm: most matched tokens first (capped at input_len - 1), stable; a request SGLang's
        in-batch check holds back goes last."""
        bs = self.block_size
        batch = SGLangRadixTree(1, "lru")  # SGLang's radix tree of the waiting prompts, anew each round
        held_back: set[int] = set()
        for seq, pages in zip(waiting, matched_pages, strict=True):
            if pages * bs > _IN_BATCH_CHECK:
                continue
            prompt = self._prompt_pages(seq)
            if batch.match_prefix(prompt).length * bs >= _IN_BATCH_DEPRIORITIZE:
                held_back.add(seq.sid)
            else:
                batch.insert(prompt)
        ranks = {
            seq.sid: min(pages * bs, max(seq.request.input_len - 1, 0))
            for seq, pages in zip(waiting, matched_pages, strict=True)
        }
        return sorted(waiting, key=lambda s: float("inf") if s.sid in held_back else -ranks[s.sid])


def _dfs_weight_order(root: RadixNode, last_nodes: list[RadixNode]) -> list[int]:
    """dfs-weight: the waiting requests' indices in a depth-first walk from `root`, a node's
    children heaviest first (weight: waiting requests ending in its subtree), a node's own
    requests after its subtrees'."""
    ending: dict[RadixNode, list[int]] = {}
    for index, node in enumerate(last_nodes):
        ending.setdefault(node, []).append(index)
    weight = {node: len(indices) for node, indices in ending.items()}
    stack: list[tuple[RadixNode, bool]] = [(root, False)]
    while stack:  # weights, children before parents
        node, done = stack.pop()
        if done:
            weight[node] = weight.get(node, 0) + sum(weight.get(c, 0) for c in node.children.values())
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(list(node.children.values())))
    order: list[int] = []
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.extend(ending.get(node, ()))
            continue
        children = sorted(node.children.values(), key=lambda c: -weight.get(c, 0))
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children))
    return order
