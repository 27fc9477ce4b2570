"""The token-level policies, one per file, as kvpress keeps one press per file.

    base.py     TokenEvictionPolicy (the spec's interface), QueryScoredPolicy, kept_for_ratio,
                top_kept, and the attention helpers the scores share
    none.py     NoEvictionPolicy: never evicts (the default)
    sliding.py  SlidingWindowPolicy: StreamingLLM's sinks and recent tokens (StreamingLLMPress)
    snapkv.py   SnapKVPolicy: attention of the observation window, pooled (SnapKVPress)
    h2o.py      H2OPolicy: accumulated attention plus a recent window (ObservedAttentionPress)
    tova.py     TOVAPolicy: the newest query's attention over all heads (TOVAPress)
    knorm.py    KnormPolicy: the smallest key norms (KnormPress)
    keydiff.py  KeyDiffPolicy: keys least like the mean key direction (KeyDiffPress)
    leverage.py LeveragePolicy: leverage of the pre-RoPE keys (LeverageScorePress)
    compactor.py CompactorPolicy: leverage blended with non-causal attention (CompactorPress)
    expected_attention.py ExpectedAttentionPolicy: a Gaussian model of future queries
                (ExpectedAttentionPress)
    adakv.py    AdaKVPolicy: per-head budgets over any press (AdaKVPress)
    pyramid.py  PyramidPolicy: per-layer budgets over any press (PyramidKVPress)
    kvzip.py    KVzipPolicy: what a replay of the context attends to (KVzipPress)
    skim.py     SkimPolicy: sage's own: per-head budgets and scores from a replay of a sample
    rope.py     pre-RoPE keys and queries from the pool and the observer (no policy)

Each file holds its policy class and its score function (tensors in, ``[kv_heads, L]`` out,
kvpress 0.5.5's semantics; tests/test_token_eviction_kvpress.py and
tests/test_token_presses_kvpress.py check the kept indices are exactly kvpress's). The names
are registered in `engine_adapter.token_eviction.registry`; importing this package imports
none of its modules (they import torch).
"""

from __future__ import annotations

__all__: list[str] = []
