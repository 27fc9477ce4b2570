"""The token-level policies, one per file, as kvpress keeps one press per file.

    base.py     TokenEvictionPolicy (the spec's interface), QueryScoredPolicy, kept_for_ratio,
                top_kept, and the attention helpers the scores share
    none.py     NoEvictionPolicy: never evicts (the default)
    sliding.py  SlidingWindowPolicy: StreamingLLM's sinks and recent tokens (StreamingLLMPress)
    snapkv.py   SnapKVPolicy: attention of the observation window, pooled (SnapKVPress)
    h2o.py      H2OPolicy: accumulated attention plus a recent window (ObservedAttentionPress)
    tova.py     TOVAPolicy: the newest query's attention over all heads (TOVAPress)

Each file holds its policy class and its score function (tensors in, ``[kv_heads, L]`` out,
kvpress 0.5.5's semantics; tests/test_token_eviction_kvpress.py checks the kept indices are
exactly kvpress's). The names are registered in `engine_adapter.token_eviction.registry`;
importing this package imports none of its modules (they import torch).
"""

from __future__ import annotations

__all__: list[str] = []
