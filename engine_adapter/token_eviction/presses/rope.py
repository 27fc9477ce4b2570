"""What the presses that score pre-RoPE vectors read: keys and queries with their rotation undone.

The pool keeps keys rotated by their RoPE positions, and the observer keeps rotated queries.
Leverage and Compactor score keys before rotation, Expected Attention the statistics of
queries before rotation (kvpress recomputes them from the layer's input). Rather than keep a
second copy of the keys, the sequence's `AttentionObserver` tracks each key's position
(``track_positions``, compacted with the keys) and the decoder's rotary embedding, and the
rotation is undone here: rotate-half RoPE is the rotation ``y = x cos + rot(x) sin``, whose
inverse is ``x = y cos - rot(y) sin`` (``rot`` the rotate-half map, ``rot(rot(x)) = -x``).
That is the same vector up to float rounding, not an approximation of it.

`rope_missing` says why a sequence cannot be scored this way (positions untracked, or the
observed queries do not cover the keys); the press then keeps the newest tokens and the caller
logs the reason, as the attention-scored presses do.

Imports torch and `SequenceKV`.
"""

from __future__ import annotations

import torch

from engine_adapter.token_eviction.sequence_kv import SequenceKV

__all__ = [
    "key_positions",
    "observed_queries",
    "pre_rope_keys",
    "queries_at_keys",
    "rope_missing",
    "rotate_half",
    "unrotate",
]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotate-half map on the last axis: ``(a, b) -> (-b, a)``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo RoPE: `x` rotated by the angles whose cos and sin are given (broadcastable)."""
    return x * cos - rotate_half(x) * sin


def key_positions(cache: SequenceKV, layer: int) -> torch.Tensor | None:
    """RoPE positions ``[kv_heads, L]`` of layer `layer`'s keys, or None when not tracked."""
    obs = cache.observer
    if obs is None or obs.rotary is None:
        return None
    return obs.positions_of(layer, cache.num_kv_heads, cache.length)


def pre_rope_keys(cache: SequenceKV, layer: int) -> torch.Tensor:
    """Layer `layer`'s keys before rotation, ``[kv_heads, L, D]`` (`rope_missing` is None)."""
    positions = key_positions(cache, layer)
    assert positions is not None and cache.observer is not None
    keys = cache.keys(layer)
    cos, sin = cache.observer.rotary.cos_sin(positions.reshape(-1), keys.dtype)
    shape = (*positions.shape, keys.shape[-1])
    return unrotate(keys, cos.view(shape), sin.view(shape))


def observed_queries(cache: SequenceKV, layer: int) -> tuple[torch.Tensor, int] | None:
    """Every query the observer saw at layer `layer` ``[heads, n, D]`` (rotated) and the RoPE
    position of the first (the others follow one by one), when it kept them all; else None."""
    obs = cache.observer
    q = None if obs is None else obs.queries.get(layer)
    if obs is None or q is None or obs.queries_from is None:
        return None
    if q.shape[1] != obs.next_position - obs.queries_from:
        return None
    return q, obs.queries_from


def queries_at_keys(cache: SequenceKV, layer: int) -> torch.Tensor | None:
    """The rotated query of each key's own token ``[heads, L, D]`` (a key of KV head h gives
    its query heads its token's queries), when the observer saw them all; else None. On a
    sequence never compacted these are simply its queries in order."""
    seen, positions = observed_queries(cache, layer), key_positions(cache, layer)
    if seen is None or positions is None:
        return None
    q, first = seen
    index = positions - first
    if int(index.min()) < 0:
        return None
    if positions.shape[1] == q.shape[1] and bool(
        (index == torch.arange(q.shape[1], device=index.device)).all()
    ):
        return q
    index = index.repeat_interleave(q.shape[0] // index.shape[0], dim=0).to(q.device)
    return q.gather(1, index[..., None].expand(-1, -1, q.shape[-1]))


def rope_missing(cache: SequenceKV, *, queries: bool) -> str | None:
    """Why pre-RoPE scoring cannot run on `cache` now (None: it can). `queries`: the press
    also needs the query of every key (Compactor, Expected Attention)."""
    obs = cache.observer
    if obs is None:
        return "no attention observer (the sequence started before this policy was set)"
    for layer in range(cache.num_layers):
        if key_positions(cache, layer) is None:
            return f"the RoPE positions of the {cache.length} keys were not tracked (layer {layer})"
        if queries and queries_at_keys(cache, layer) is None:
            return f"the observer did not keep the query of every token (layer {layer})"
    return None
