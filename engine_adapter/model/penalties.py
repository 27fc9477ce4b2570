"""OpenAI's frequency and presence penalties, applied to a batch's logits before sampling.

OpenAI's definition (its API reference, "Frequency and presence penalties"), which vLLM and
SGLang follow, over the tokens the request has generated so far (never its prompt):

    logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty

A row whose request has neither penalty is left untouched (no copy, no count). A preempted
request keeps its output tokens, so its recompute penalises exactly as before.

Imports torch and the sampling parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine_adapter.model.sampling import SamplingParams

__all__ = ["apply_penalties"]


def apply_penalties(
    logits: torch.Tensor, params: Sequence[SamplingParams], output_ids: Sequence[Sequence[int]]
) -> torch.Tensor:
    """`logits` ``[batch, vocab]`` with each row's penalties applied (a new tensor when any row
    has one, else `logits` itself).

    Args:
        logits: One row of next-token logits per request.
        params: Each row's sampling parameters.
        output_ids: Each row's generated tokens so far.
    """
    rows = [i for i, p in enumerate(params) if p.penalized and output_ids[i]]
    if not rows:
        return logits
    out = logits.clone()
    vocab = logits.shape[-1]
    for i in rows:
        ids = torch.tensor(output_ids[i], dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=vocab).to(out.dtype)
        p = params[i]
        out[i] -= counts * p.frequency_penalty + (counts > 0).to(out.dtype) * p.presence_penalty
    return out
