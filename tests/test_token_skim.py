"""`skim`, sage's own press (issue 36, item 4): an evenly spread sample of the context is
replayed, its scores set every head's budget and rank that head's tokens.

Deterministic properties on fixed inputs (the spans, the budgets), the press on sage-tiny (its
byte tokenizer has a chat template, so the replay runs: the counts, the sinks, each row the top
replay scores, the borrowed blocks given back, the fallback without room), and on SmolLM2 the
claim the press rests on: the budgets of a 2.5 % replay follow the ones KVzip's whole replay
sets. The engine paths (a request's ``kv_compression``, memory pressure, the contract of every
registered policy) run skim as every other press in tests/test_token_attention.py and
tests/test_token_policies.py.
"""

from __future__ import annotations

import pytest
import torch
from model_fixtures import needs_smollm2, one_thread_fixture, smollm2_fixture

from engine_adapter.model import load_model
from engine_adapter.model.chat_template import ChatMessage, render_chat
from engine_adapter.model.decoder import Decoder
from engine_adapter.token_eviction.generate import prefill
from engine_adapter.token_eviction.presses.base import kept_for_ratio
from engine_adapter.token_eviction.presses.kvzip import KVzipPolicy, replay_scores
from engine_adapter.token_eviction.presses.skim import SkimPolicy, head_budgets, sampled_spans

__all__ = ["one_thread_fixture", "smollm2_fixture"]

PROMPT = [int(t) for t in torch.randint(97, 123, (300,), generator=torch.Generator().manual_seed(3))]


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    model, _tokenizer, _config = load_model("sage-tiny", device="cpu")
    return model


def test_sampled_spans_are_spread_evenly_inside_the_budget() -> None:
    # 1000 tokens past 10, 100 to replay: four spans of 24, one in the middle of each quarter
    assert sampled_spans(10, 1010, 24, 100) == [(123, 147), (373, 397), (623, 647), (873, 897)]
    assert sampled_spans(10, 1010, 24, 10) == [(505, 515)]  # less than a span: one, shorter
    assert sampled_spans(10, 40, 8, 100) == [(10, 40)]  # the budget covers it all
    assert sampled_spans(10, 10, 8, 5) == []
    for first, length, span, budget in ((4, 333, 7, 50), (0, 97, 24, 30), (30, 2048, 24, 51)):
        spans = sampled_spans(first, length, span, budget)
        covered = [i for lo, hi in spans for i in range(lo, hi)]
        assert 0 < len(covered) <= budget and len(set(covered)) == len(covered)
        assert min(covered) >= first and max(covered) < length and covered == sorted(covered)


def test_head_budgets_follow_the_share_above_the_global_threshold() -> None:
    # head (0, 0) reads all of its sample, (1, 1) half, the others nothing: 15 of 40 high
    sampled = torch.zeros(2, 2, 10)
    sampled[0, 0] = 1.0
    sampled[1, 1, :5] = 1.0
    counts = head_budgets(sampled, 0.5, target_len=50, length=100, floor=5)
    # floors of 5, then the 180 left in proportion 1 : 0.5; (0, 0) capped at 100, its excess
    # to (1, 1): 5 + 60 + 25
    assert counts.tolist() == [[100, 5], [5, 90]]
    assert head_budgets(torch.ones(3, 2, 8), 0.75, 25, 100, 5).tolist() == [[25, 25]] * 3
    # a budget under the floor: every head keeps the budget (the sinks are kept first anyway)
    assert head_budgets(sampled, 0.5, target_len=3, length=100, floor=5).tolist() == [[3, 3], [3, 3]]
    for ratio in (0.3, 0.5, 0.9):
        noisy = torch.rand(5, 3, 40, generator=torch.Generator().manual_seed(int(ratio * 10)))
        counts = head_budgets(noisy, ratio, target_len=37, length=200, floor=5)
        assert int(counts.sum()) == 37 * 15 and int(counts.min()) >= 5 and int(counts.max()) <= 200


@pytest.mark.slow  # sage-tiny's prefill of 300 tokens and a replay: seconds on a shared CPU
def test_skim_keeps_each_heads_top_replay_scores_within_its_budget(
    decoder: Decoder, one_thread: None
) -> None:
    policy = SkimPolicy(replay_fraction=0.1, span=8)
    pool = decoder.make_pool(num_blocks=160, block_size=4)
    kv, _ = prefill(decoder, pool, PROMPT, policy)
    assert policy.attention_missing(kv) is None
    planned = policy.spans_and_ids(kv)
    assert planned is not None
    spans, ids = planned
    assert sum(hi - lo for lo, hi in spans) == 24  # three spans of 8 in the 30 of 10 %
    before, free = kv.keys(2).clone(), pool.allocator.num_free
    target = kept_for_ratio(len(PROMPT), 0.75)
    policy.ratio = 0.75
    keep, counts = policy.select(kv, target)
    assert pool.allocator.num_free == free, "the replay's borrowed blocks were not given back"
    assert torch.equal(kv.keys(2), before), "the replay wrote into the sequence's own blocks"
    assert counts is not None and int(counts.sum()) == target * counts.numel()
    assert int(counts.max()) > int(counts.min()), "the replay set no head a budget of its own"
    expected = replay_scores(kv, [(0, len(PROMPT), ids)], n_sink=0)
    for layer in range(keep.shape[0]):
        for head in range(keep.shape[1]):
            row = keep[layer, head, : counts[layer, head]]
            assert row[:4].tolist() == [0, 1, 2, 3], "a head dropped a sink"
            rest = expected[layer, head, 4:]
            kept_rest = row[4:] - 4
            dropped = torch.ones_like(rest, dtype=torch.bool)
            dropped[kept_rest] = False
            if bool(dropped.any()) and len(kept_rest):
                assert float(rest[kept_rest].min()) >= float(rest[dropped].max()), (layer, head)
    assert policy.evict(kv, target, ratio=0.75) == len(PROMPT) - int(counts.max())


@pytest.mark.slow  # sage-tiny's prefill of 300 tokens
def test_skim_without_room_for_the_replay_keeps_the_sinks_and_the_newest(
    decoder: Decoder, one_thread: None
) -> None:
    policy = SkimPolicy()
    pool = decoder.make_pool(num_blocks=76, block_size=4)  # the prompt's 75 blocks, and one
    kv, _ = prefill(decoder, pool, PROMPT, policy)
    assert "free blocks" in (policy.attention_missing(kv) or "")
    keep, counts = policy.select(kv, 100)
    assert counts is None
    assert torch.equal(keep[3, 1], torch.cat([torch.arange(4), torch.arange(204, 300)]))


@needs_smollm2
@pytest.mark.slow  # a SmolLM2 prefill of ~600 tokens and KVzip's whole replay: a minute on a busy CPU
def test_skims_budgets_follow_kvzips_on_smollm2(smollm2: tuple[Decoder, object, object]) -> None:
    """The press's premise: on a context with key-number lines, the per-head budgets a replay
    of 2.5 % of the context sets correlate with those KVzip's whole replay sets, far above
    what uniform budgets give (0); the head KVzip gives the most keeps over half the context."""
    decoder, tokenizer, _config = smollm2
    sentences = [f"The {w} shop on {s} street opens at nine and closes late." for w in WORDS for s in STREETS]
    for i, key in enumerate(("amber", "falcon", "orbit")):
        sentences.insert(5 + 12 * i, f"One of the special magic numbers for {key} is: {4825731 + 1111 * i}.")
    rendered = render_chat(tokenizer.chat_template, [ChatMessage("user", " ".join(sentences))])  # type: ignore[attr-defined]
    ids = tokenizer.encode(rendered, add_special_tokens=False)  # type: ignore[attr-defined]
    pool = decoder.make_pool(num_blocks=-(-len(ids) // 16) * 2 + 8, block_size=16)
    skim, kvzip = SkimPolicy(), KVzipPolicy()
    kv, _ = prefill(decoder, pool, ids, skim)
    target = kept_for_ratio(len(ids), 0.75)
    skim.ratio = kvzip.ratio = 0.75
    _keep, ours = skim.select(kv, target)
    _keep, theirs = kvzip.select(kv, target)
    assert ours is not None and theirs is not None
    pair = torch.stack([ours.flatten().float(), theirs.flatten().float()])
    correlation = float(torch.corrcoef(pair)[0, 1])  # 0.85 when written
    assert correlation > 0.6, correlation
    widest = theirs.flatten().argmax()
    assert int(ours.flatten()[widest]) > len(ids) // 2


WORDS = ["bread", "flower", "book", "tea"]
STREETS = ["Oak", "Mill", "Bridge", "Church", "Harbour", "Station", "Market", "Castle", "River", "Hill"]
