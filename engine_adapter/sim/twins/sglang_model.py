"""The simulator's ``sglang`` cache model: `SGLangRadixTree` (the ``unified`` tree SGLang 0.5.23
serves with) in SGLang's request life cycle.

A workload's requests carry block keys, not tokens (Mooncake's hash ids, the generator's
chained keys: equal key, equal content and prefix), so the tree runs at page granularity with one
page per block: each block key stands for its page of `block_size` tokens, which is exactly
SGLang's tree at ``page_size = block_size`` (two pages match when their tokens and prefixes do).
The pool holds `capacity` pages: the tree's pages and the running requests' own pages.

A request's life, as SGLang 0.5.23's scheduler runs it (managers/schedule_batch.py, scheduler):

- Admission: match the prompt, at most ``input_len - 1`` tokens (SGLang keeps one token to
  compute) cut to whole pages; lock the matched node; the request needs its pages minus the hit.
  When the free pages fall short the tree evicts (the request's own path locked); when free and
  evictable pages together fall short it is not admitted (the lock is dropped, the match stays:
  SGLang matches queued requests every round).
- After its prefill: its prompt's whole pages enter the tree (insert, then match, lock the new
  node, unlock the old: SGLang's checkpoint); a partial last page stays the request's own.
- Decode pages are the request's own (their keys are not in a block-key trace; SGLang would
  insert the output at finish, so a next turn that repeats the answer hits in SGLang and not here).
- Finish: its prompt is inserted again (SGLang's checkpoint at release refreshes the path's
  access time and hit counts) and unlocked; its own pages are freed.
- Retraction (preemption) when decode cannot get a page: SGLang's order, the running request with
  the fewest output tokens, then the longest prompt, then the latest in the batch; its path is
  unlocked and stays cached, its own pages are freed, it re-prefills from the queue.

- A retracted request goes to the back of the queue (SGLang appends it), where sage's own
  engine puts a preempted sequence at the head.
- The queue order (``--schedule-policy``, `SCHEDULE_POLICIES`), at each admission round with the
  queue not empty and room in the batch (where SGLang's scheduler calls ``calc_priority``):
  ``fcfs`` keeps arrival order and, under the ``lru`` strategy, refreshes the prefixes of the first
  128 waiting requests (last first, so the head is the newest) every 32nd round;
  ``lpm`` (longest prefix match; ``fcfs`` once more than 128 wait) matches every waiting
  prompt, then sorts by matched tokens (capped at ``input_len - 1``), longest first, stably; a
  request whose own match is at most 32 tokens and whose prompt shares 32 tokens or more with an
  earlier waiting one (SGLang's in-batch prefix check, a radix tree of the waiting prompts) goes
  last; ``dfs-weight`` matches every waiting prompt and orders the queue by a depth-first walk of
  the tree from the root, heavier subtrees (more waiting requests ending in them) first, a
  node's own requests after its subtrees'. The matches refresh the tree as SGLang's do.
- A sage policy plugged into SGLang (``sage-<spec>``, SGLang's own name for it) chooses the
  tree's victims through `sage_eviction.integrations.sglang`'s own event mapping
  (`SageTreeEvents`), the code that runs inside SGLang.

Hits are counted in pages (blocks): SGLang's ``match_prefix`` length over the page size; keys
are pages, so SGLang's token thresholds (the in-batch check's 32 tokens) read as whole pages.
Not modelled: chunked prefill, the in-batch prefix checks of its prefill adder, priority
scheduling, and the ``hrrn``, ``lof``, ``random`` and ``routing-key`` orders.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine_adapter.sim.sequence import SimSequence
from engine_adapter.sim.sim_result import ModelStats, TierLoads
from engine_adapter.sim.twins.sglang_queue import SCHEDULE_POLICIES, QueueOrder
from engine_adapter.sim.twins.sglang_radix import RadixNode, SGLangRadixTree
from sage_eviction.integrations.sglang import PREFIX as SAGE_PREFIX
from sage_eviction.metrics import LatencyRecorder, ReprefillTracker

__all__ = ["SCHEDULE_POLICIES", "SGLangModel", "check_sglang_policy", "parse_sglang_policy"]


def parse_sglang_policy(spec: str) -> tuple[str, dict[str, Any]]:
    """``"slru:protected_threshold=3"`` -> ``("slru", {"protected_threshold": 3})``; a sage
    policy (``"sage-s3fifo:small_ratio=0.2"``) keeps its whole spec as its name.

    Raises:
        ValueError: A parameter that is not ``name=integer``.
    """
    if spec.strip().lower().startswith(SAGE_PREFIX):
        return spec.strip(), {}
    name, _, params = spec.partition(":")
    config: dict[str, Any] = {}
    for item in filter(None, params.split(",")):
        key, sep, value = item.partition("=")
        try:
            config[key.strip()] = int(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"bad parameter {item!r} in {spec!r}: want name=integer") from None
    return name.strip(), config


def check_sglang_policy(spec: str) -> None:
    """Refuse a spec the model cannot run (an unknown SGLang strategy, a bad config, a sage
    policy sage cannot build online).

    Raises:
        ValueError: What is wrong, in one line (`PolicyConfigError` for a sage policy).
    """
    SGLangRadixTree(1, *parse_sglang_policy(spec), capacity=1)


@dataclass(slots=True)
class _Running:
    """A running request's share of the pool: its locked node, the tree pages on its path,
    its own pages, and its tokens at the last reservation."""

    node: RadixNode
    tree_pages: int
    own_pages: int
    tokens: int
    order: int  # when it (re-)entered the batch: SGLang's last in the batch retracts first


class SGLangModel:
    """SGLang's radix cache and retraction as the event loop's cache model (module docstring).

    Args:
        policy: An SGLang eviction strategy spec (``"lru"``, ``"slru:protected_threshold=3"``) or
            a sage policy plugged in (``"sage-s3fifo"``).
        capacity: Pages (blocks) in the pool.
        block_size: Tokens per page.
        schedule_policy: SGLang's queue order, one of `SCHEDULE_POLICIES`.
    """

    loaded = TierLoads()  # no host tier: nothing is loaded back
    policy_calls = "python"  # the tree calls SGLang's strategies and sage's policies in Python

    def __init__(self, policy: str, capacity: int, block_size: int, schedule_policy: str = "fcfs") -> None:
        name, config = parse_sglang_policy(policy)
        # one block key per page (module docstring); a sage policy's capacity: the pool's pages
        self.tree = SGLangRadixTree(1, name, config, capacity=capacity)
        self.queue_order = QueueOrder(self.tree, schedule_policy, block_size)
        self.capacity = capacity
        self.block_size = block_size
        self.running: dict[int, _Running] = {}
        self._own = 0  # the running requests' own pages
        self._entered = 0
        self.evictions = 0
        self.preemptions = 0
        self.peak_used = 0
        self.reprefill = ReprefillTracker(None)  # a simulator row's: the whole run
        self.latency = LatencyRecorder()

    # ------------------------------------------------------------------ the pool

    def _free_pages(self) -> int:
        return self.capacity - self.tree.total_size() - self._own

    def _make_room(self, pages: int) -> bool:
        """Free pages enough for `pages` more, evicting from the tree; False (nothing evicted)
        when free and evictable pages together fall short."""
        free = self._free_pages()
        if free >= pages:
            return True
        if free + self.tree.evictable_size < pages:
            return False
        start = time.perf_counter()
        victims = self.tree.evict(pages - free)
        self.latency.record(time.perf_counter() - start)
        for node in victims:
            self.evictions += len(node.key)
            self.reprefill.on_evicts(node.key)
        return True

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ------------------------------------------------------------------ the event loop's calls

    def order_waiting(self, waiting: deque[SimSequence], room: bool) -> None:
        """A round of admission: SGLang's queue order (`QueueOrder`); `room`: the batch has room
        (SGLang's scheduler returns before ordering when it has none)."""
        if waiting and room:
            self.queue_order.order(waiting)

    def allocate(self, seq: SimSequence) -> int | None:
        """Hit pages of the prompt, or None when SGLang would not admit it now."""
        r = seq.request
        limit = min(len(seq.keys), max(r.input_len - 1, 0) // self.block_size)
        match = self.tree.match_prefix(seq.keys[:limit])
        tree = self.tree
        tree.inc_lock_ref(match.node)
        if not self._make_room(self._pages(seq.tokens) - match.length):
            tree.dec_lock_ref(match.node)
            return None
        self.reprefill.on_requests(seq.keys[match.length : limit])
        whole = seq.keys[: min(len(seq.keys), r.input_len // self.block_size)]
        tree.insert(whole, priority=r.priority or 0)
        node = tree.match_prefix(whole).node
        tree.inc_lock_ref(node)
        tree.dec_lock_ref(match.node)
        own = self._pages(seq.tokens) - len(whole)
        self._own += own
        self.running[seq.sid] = _Running(node, len(whole), own, seq.tokens, self._entered)
        self._entered += 1
        self._note_use()
        return match.length

    def reserve(self, seq: SimSequence, tokens: int) -> bool:
        """Pages for `tokens` in all; evicts for them, False when the pool cannot give them."""
        held = self.running[seq.sid]
        more = self._pages(tokens) - held.tree_pages - held.own_pages
        if more > 0:
            if not self._make_room(more):
                return False
            held.own_pages += more
            self._own += more
            self._note_use()
        held.tokens = tokens
        return True

    def select_victims(self, exclude: list[int]) -> list[int]:
        """The request SGLang retracts first among the running ones not in `exclude`."""
        skip = set(exclude)
        candidates = [(sid, held) for sid, held in self.running.items() if sid not in skip]
        if not candidates:
            return []
        sid, _ = min(candidates, key=self._retraction_rank)
        return [sid]

    def _retraction_rank(self, item: tuple[int, _Running]) -> tuple[int, int, int]:
        """Smallest first: fewest output tokens, longest prompt, latest in the batch (the
        output known to the page: the loop reserves at page boundaries)."""
        _, held = item
        prompt = held.tree_pages * self.block_size
        return (held.tokens - prompt, -prompt, -held.order)

    def preempt(self, seq: SimSequence) -> None:
        held = self.running.pop(seq.sid)
        self.tree.dec_lock_ref(held.node)
        self._own -= held.own_pages
        self.preemptions += 1

    def free(self, seq: SimSequence) -> None:
        held = self.running.pop(seq.sid)
        r = seq.request
        whole = seq.keys[: held.tree_pages]
        self.tree.insert(whole, priority=r.priority or 0, inserted_len=held.tree_pages)
        self.tree.dec_lock_ref(held.node)
        self._own -= held.own_pages

    def _note_use(self) -> None:
        self.peak_used = max(self.peak_used, self.capacity - self._free_pages())

    # ------------------------------------------------------------------ the row

    def compressed(self) -> dict[str, Any]:
        return {}  # no compress-on-evict in SGLang

    def regret(self) -> dict[str, Any]:
        return {}  # SGLang keeps no ghosts or ages: the row's regret fields keep their defaults

    def prefetch_hits(self) -> int:
        return 0

    def stats(self) -> ModelStats:
        """The row's figures: memory utilization is the peak pages in use over the pool (once
        anything was evicted), evictions are pages."""
        p50, p99 = self.latency.quantiles(0.5, 0.99)
        utilization = self.peak_used / self.capacity if self.evictions else 0.0
        return ModelStats(
            self.reprefill.rate, utilization, self.evictions, p50 * 1e6, p99 * 1e6, self.preemptions
        )
