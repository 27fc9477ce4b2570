"""The pool of one colocation run, as the first colocation simulator kept it: an LRU of whole
system-prompt templates beside the running requests' own blocks and the embedding workspaces.

Behind the interface the run calls (admit, grow, release, preempt, reserve, the counts), so that
the restructured run gives the same figures; the cache manager takes its place next.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from engine_adapter.colocation import MemoryState
from engine_adapter.sim.colocation.workload import LLMRequest, PoolShape

__all__ = ["ColocationPool"]


class ColocationPool:
    def __init__(self, shape: PoolShape, template_tokens: int) -> None:
        self.total = shape.total_blocks
        self.block_size = shape.block_size
        self.template_blocks = math.ceil(template_tokens / self.block_size)
        self.templates: OrderedDict[int, int] = OrderedDict()
        self.llm_own = 0
        self.emb_used = 0
        self._seqs: dict[int, list[int]] = {}  # sid -> [template, own blocks]
        self._reservations: dict[int, int] = {}

    def _resident(self) -> int:
        return len(self.templates) * self.template_blocks

    def _pinned(self) -> int:
        return sum(1 for pins in self.templates.values() if pins) * self.template_blocks

    @property
    def free(self) -> int:
        return self.total - self.llm_own - self._resident() - self.emb_used

    @property
    def available(self) -> int:
        unpinned = sum(1 for pins in self.templates.values() if not pins) * self.template_blocks
        return self.free + unpinned

    @property
    def used(self) -> int:
        return self.llm_own + self._resident() + self.emb_used

    @property
    def embedding_used(self) -> int:
        return self.emb_used

    @property
    def llm_used(self) -> int:
        return self.llm_own + self._resident()

    @property
    def llm_held(self) -> int:
        return self.llm_own + self._pinned()

    def memory(self) -> MemoryState:
        used_llm = self.llm_used
        return MemoryState(self.total, used_llm, self.emb_used, self.total - used_llm - self.emb_used)

    def _evict_cached(self, blocks: int) -> bool:
        while self.free < blocks:
            victim = next((t for t, pins in self.templates.items() if pins == 0), None)
            if victim is None:
                return False
            del self.templates[victim]
        return True

    def _llm_fits(self, blocks: int, cap: int) -> bool:
        if self.llm_own + self._pinned() + blocks > cap:
            return False
        if self.llm_own + self._resident() + blocks > cap:
            while self.templates and self.llm_own + self._resident() + blocks > cap:
                victim = next((t for t, pins in self.templates.items() if pins == 0), None)
                if victim is None:
                    break
                del self.templates[victim]
        return self._evict_cached(blocks)

    def admit(
        self, sid: int, request: LLMRequest, generated: int, llm_cap: int, deadline: float | None
    ) -> int | None:
        q = request
        hit = q.template in self.templates
        if hit:
            self.templates[q.template] += 1
        own_tokens = q.prompt_tokens - q.prefix_tokens + generated
        own_blocks = math.ceil((own_tokens + 1) / self.block_size)
        if not self._llm_fits(own_blocks + (0 if hit else self.template_blocks), llm_cap):
            if hit:
                self.templates[q.template] -= 1
            return None
        if not hit:
            self.templates[q.template] = 1
        self.templates.move_to_end(q.template)
        self._seqs[sid] = [q.template, own_blocks, q.prefix_tokens]
        self.llm_own += own_blocks
        return q.prefix_tokens if hit else 0

    def needs_block(self, sid: int, tokens: int) -> bool:
        _, own, prefix = self._seqs[sid]
        return math.ceil((tokens - prefix) / self.block_size) > own

    def grow(self, sid: int, tokens: int, llm_cap: int) -> bool:
        if not self._llm_fits(1, llm_cap):
            return False
        self._seqs[sid][1] += 1
        self.llm_own += 1
        return True

    def sequence_blocks(self, sid: int) -> int:
        entry = self._seqs.get(sid)
        return 0 if entry is None else entry[1] + self.template_blocks

    def private_blocks(self, sid: int) -> int:
        entry = self._seqs.get(sid)
        return 0 if entry is None else entry[1]

    def release(self, sid: int) -> None:
        template, own, _ = self._seqs.pop(sid)
        self.llm_own -= own
        self.templates[template] -= 1

    def preempt(self, sid: int) -> None:
        self.release(sid)

    def reserve(self, owner: int, blocks: int) -> bool:
        if not self._evict_cached(blocks):
            return False
        self._reservations[owner] = blocks
        self.emb_used += blocks
        return True

    def release_reservation(self, owner: int) -> None:
        self.emb_used -= self._reservations.pop(owner)
