"""Token policy specs (``name`` or ``name:k=v,...``; a wrapper's ``adakv:snapkv``) and the
guards of head-varying compaction, without a model beyond sage-tiny."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine_adapter.model import load_model
from engine_adapter.model.decoder import AttentionObserver
from engine_adapter.serving.config import ConfigError, resolve_config
from engine_adapter.token_eviction.generate import prefill
from engine_adapter.token_eviction.presses.knorm import KnormPolicy
from engine_adapter.token_eviction.registry import (
    TokenPolicyParamError,
    UnknownTokenPolicyError,
    parse_token_spec,
    token_policy_from_spec,
)


def test_a_spec_names_a_policy_and_its_params() -> None:
    assert parse_token_spec("knorm") == ("knorm", {})
    assert parse_token_spec(" Compactor:chunk_size=128, blending=0.5 ") == (
        "compactor",
        {"chunk_size": "128", "blending": "0.5"},
    )
    assert parse_token_spec("adakv:snapkv,alpha_safeguard=0.1") == (
        "adakv",
        {"press": "snapkv", "alpha_safeguard": "0.1"},
    )
    policy = token_policy_from_spec("adakv:snapkv,alpha_safeguard=0.1,observation_window=16")
    assert policy.params() == {
        "press": "snapkv",
        "alpha_safeguard": 0.1,
        "observation_window": 16,
        "kernel_size": 5,
    }
    assert token_policy_from_spec("pyramid").params()["press"] == "snapkv"  # the default press
    assert (
        token_policy_from_spec("expected_attention:use_covariance=false").params()["use_covariance"] is False
    )


@pytest.mark.parametrize(
    ("spec", "error", "needle"),
    [
        ("lru", UnknownTokenPolicyError, "choose one of"),
        ("knorm:3", TokenPolicyParamError, "'3' is not k=v"),
        ("snapkv:observation_window=many", TokenPolicyParamError, "is not an int"),
        ("adakv:lru", UnknownTokenPolicyError, "'lru'"),
        ("adakv:adakv", TokenPolicyParamError, "cannot wrap another budget wrapper"),
        ("adakv:kvzip", TokenPolicyParamError, "cannot wrap a replay press"),
        ("pyramid:press=skim", TokenPolicyParamError, "cannot wrap a replay press"),
        ("adakv:snapkv,no_such=1", TokenPolicyParamError, "no param 'no_such'"),
        ("adakv:alpha_safeguard=2", TokenPolicyParamError, "alpha_safeguard must be in"),
    ],
)
def test_a_bad_spec_is_one_clear_error(spec: str, error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        token_policy_from_spec(spec)


def test_the_config_takes_a_spec_and_refuses_a_bad_param() -> None:
    spec = resolve_config({"token_eviction": "adakv:knorm,alpha_safeguard=0.5"}, environ={}).token_eviction
    assert spec == "adakv:knorm,alpha_safeguard=0.5"
    with pytest.raises(ConfigError, match=r"token-eviction: .* has no param 'nope'"):
        resolve_config({"token_eviction": "knorm:nope=1"}, environ={})


@pytest.fixture(scope="module")
def tiny_kv() -> object:
    decoder, _tok, _cfg = load_model("sage-tiny", device="cpu")
    return decoder


def test_compaction_refuses_bad_counts_and_padding_out_of_order(tiny_kv: object) -> None:
    decoder = tiny_kv
    ids = torch.randint(3, 250, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    pool = decoder.make_pool(num_blocks=32, block_size=4)  # type: ignore[attr-defined]
    kv, _ = prefill(decoder, pool, ids, KnormPolicy())  # type: ignore[arg-type]
    layers, heads = kv.num_layers, kv.num_kv_heads
    keep = torch.arange(10).expand(layers, heads, 10).clone()
    for counts in (torch.zeros(layers, heads, dtype=torch.long), torch.full((layers, heads), 11)):
        with pytest.raises(ValueError, match="counts must be"):
            kv.compact(keep, counts)
    counts = torch.full((layers, heads), 10)
    counts[0, 0] = 6
    unordered = keep.clone()
    unordered[0, 1, 3] = 0  # a real row out of order (not padding) is refused
    with pytest.raises(ValueError, match="ascending"):
        kv.compact(unordered, counts)
    keep[0, 0, 6:] = 5  # padding repeats the row's last kept index
    assert kv.compact(keep, counts) == 30 and kv.length == 10
    assert kv.key_mask is not None and kv.key_mask.sum() == layers * heads * 10 - 4
    assert kv.key_mask[0, 0].tolist() == [True] * 6 + [False] * 4
    # a later compaction carries the padding: a padded index kept stays padding
    again = torch.arange(2, 10).expand(layers, heads, 8).clone()
    kv.compact(again, None)
    assert kv.key_mask is not None and kv.key_mask[0, 0].tolist() == [True] * 4 + [False] * 4


def test_positions_follow_tokens_and_forget_a_gap() -> None:
    obs = AttentionObserver(track_positions=True)
    obs.note_positions(torch.arange(5, 8), start=5)  # the first tokens past a cached prefix
    assert obs.positions is not None and obs.positions.tolist() == [list(range(8))]
    assert (obs.queries_from, obs.next_position) == (5, 8)
    obs.note_positions(torch.tensor([8]), start=8)
    assert obs.positions.tolist() == [list(range(9))]
    obs.note_positions(torch.tensor([20]), start=12)  # tokens it never saw: positions unknown
    assert obs.positions is None


# Five prefills each (seconds): one in the quick loop, the others in the full run.
@pytest.mark.parametrize(
    "spec",
    [
        "adakv:knorm",
        pytest.param("adakv:snapkv,observation_window=16", marks=pytest.mark.slow),
        pytest.param("pyramid:knorm,window_size=8", marks=pytest.mark.slow),
    ],
)
def test_head_varying_budgets_hold_fewer_bytes_as_the_ratio_grows(tiny_kv: object, spec: str) -> None:
    """The padded pool gives blocks back: the K/V bytes a compressed sequence holds fall with
    the ratio (kvpress's AdaKV masks keep every byte). Never up; pyramid's widest (first) layer
    is capped at the prompt less its window at low ratios, so 0.25 and 0.5 may hold the same."""
    decoder = tiny_kv
    ids = torch.randint(3, 250, (160,), generator=torch.Generator().manual_seed(4)).tolist()
    policy = token_policy_from_spec(spec)
    held = []
    for ratio in (0.0, 0.25, 0.5, 0.75, 0.9):
        pool = decoder.make_pool(num_blocks=64, block_size=4)  # type: ignore[attr-defined]
        kv, _ = prefill(decoder, pool, ids, policy)  # type: ignore[arg-type]
        if ratio:
            policy.evict(kv, int(len(ids) * (1 - ratio)), ratio=ratio)
        held.append(kv.memory_usage_bytes())
        assert pool.allocator.num_free == 64 - kv.num_blocks()  # the rest went back to the pool
    assert all(a >= b for a, b in itertools.pairwise(held)), held
    assert held[1] < held[0] or spec.startswith("pyramid"), held
    assert held[-1] * 2 < held[0], held
