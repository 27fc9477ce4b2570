"""`precise`: each request to the replica whose cache really holds the longest prefix of it.

What a router fed by the engines' KV cache events knows (llm-d's precise prefix-cache scorer,
NVIDIA Dynamo's KV router: both index vLLM's ``BlockStored`` / ``BlockRemoved`` events): not
what it sent where, but which blocks each engine holds now, evictions included. Here the index
is the replica's own radix cache, asked without side effects (`Replica.cached_prefix_blocks`).

The score is the cached prefix in blocks, highest wins; ties (no replica caching any of it, the
first turn of a conversation) go to the fewest outstanding tokens, then the lowest index. This
is the prefix scorer alone: llm-d weighs it with load scorers, Dynamo with the blocks each
worker has to prefill and decode; `predicted_ttft` is sage's way of weighing both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine_adapter.sim.fleet.router import Router

if TYPE_CHECKING:
    from engine_adapter.sim.workloads import SimRequest

__all__ = ["Precise"]


class Precise(Router):
    name = "precise"
    models = "llm-d precise prefix-cache scorer; NVIDIA Dynamo KV router (KV-event-fed)"

    def route(self, request: SimRequest, now: float) -> int:
        keys = request.block_hashes
        replicas = self.replicas
        cached = [replica.cached_prefix_blocks(keys) for replica in replicas]
        return min(range(len(replicas)), key=lambda i: (-cached[i], replicas[i].outstanding_tokens, i))
