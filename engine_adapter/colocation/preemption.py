"""Algorithm 3 (SLO-aware eviction) over requests: which running LLM requests to preempt.

The spec (section 3.4):

    cost(r) = PRIORITY_WEIGHTS[r.priority] * 1 / (slack(r) + EPS) + r.generated * RECOMPUTE_WEIGHT
    sort ascending by cost; take requests until the blocks needed are freed, skipping those
    with fewer than COMPLETION_THRESHOLD estimated remaining tokens (nearly finished).

A request past its deadline has negative slack and so negative cost: it goes first, as the
spec's formula says (it cannot meet its SLO any more). The block-level form of the same idea is
the `slo` eviction policy (sage_eviction/policies/slo.py), fed each block's deadline from
`ColocationController.slack_s`.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.colocation.records import ColocationParams

__all__ = ["Candidate", "eviction_cost", "select_victims"]

Candidate = tuple[str, float, int, int, int, int]
"""(request_id, slack_s, priority, generated_tokens, remaining_tokens, blocks)."""


def eviction_cost(slack_s: float, priority: int, generated_tokens: int, params: ColocationParams) -> float:
    """Line 14: priority_factor / (slack + eps) + recompute_cost (higher: keep)."""
    weights = params.priority_weights
    factor = weights[min(max(priority, 0), len(weights) - 1)]
    denominator = slack_s + params.eps
    if denominator == 0:
        denominator = params.eps  # the one slack the formula cannot divide by
    return factor / denominator + generated_tokens * params.recompute_weight


def select_victims(
    candidates: Sequence[Candidate], blocks_needed: int, params: ColocationParams
) -> list[str]:
    """Lines 17-32: the cheapest unprotected requests until `blocks_needed` blocks are freed.

    As the spec writes it, the list may free less than asked when too many are protected.
    """
    costed = sorted(
        (eviction_cost(slack, priority, generated, params), index, rid, remaining, blocks)
        for index, (rid, slack, priority, generated, remaining, blocks) in enumerate(candidates)
    )
    victims: list[str] = []
    freed = 0
    for _cost, _index, rid, remaining, blocks in costed:
        if freed >= blocks_needed:
            break
        if remaining < params.completion_threshold:
            continue
        victims.append(rid)
        freed += blocks
    return victims
