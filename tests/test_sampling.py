"""Sampling: greedy, seeded reproducibility, top-k / top-p support, validation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine_adapter.model import SamplingParams, make_generator, sample, sample_batch

LOGITS = torch.tensor([1.0, 3.0, 0.5, 2.5, -1.0, 2.9, 0.0, 1.5])
BY_RANK = [1, 5, 3, 7, 0, 2, 6, 4]  # token ids from most to least likely


def _draws(params: SamplingParams, n: int = 400, seed: int = 7) -> list[int]:
    generator = make_generator(seed)
    return [sample(LOGITS, params, generator) for _ in range(n)]


def test_defaults_are_greedy_and_match_the_engine_contract() -> None:
    params = SamplingParams()
    assert params.greedy
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.0, 1.0, 0, 16)
    assert params.stop == () and params.seed is None


def test_greedy_is_the_argmax_whatever_the_generator() -> None:
    params = SamplingParams(temperature=0.0, top_k=3, top_p=0.5)
    assert {sample(LOGITS, params, make_generator(s)) for s in range(5)} == {1}
    assert sample(LOGITS, params) == 1


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    first = _draws(params, seed=1234)
    assert _draws(params, seed=1234) == first
    assert _draws(params, seed=4321) != first
    assert len(set(first)) > 3  # a real distribution, not a constant


def test_draws_follow_the_softmax() -> None:
    n = 4000
    counts = Counter(_draws(SamplingParams(temperature=1.0), n=n))
    probs = torch.softmax(LOGITS, dim=-1)
    for token, p in enumerate(probs.tolist()):
        # 5 standard deviations of a binomial count
        assert abs(counts[token] - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_top_k_restricts_the_support() -> None:
    draws = _draws(SamplingParams(temperature=1.0, top_k=3))
    assert set(draws) == set(BY_RANK[:3])
    assert set(_draws(SamplingParams(temperature=5.0, top_k=1))) == {BY_RANK[0]}


def test_top_p_restricts_the_support() -> None:
    probs = torch.softmax(LOGITS, dim=-1)
    sorted_probs = probs[BY_RANK]
    # The smallest prefix of the ranking whose mass reaches top_p.
    top_p = float(sorted_probs[:3].sum()) - 1e-3
    draws = _draws(SamplingParams(temperature=1.0, top_p=top_p))
    assert set(draws) == set(BY_RANK[:3])
    # A top_p below the most likely token's mass keeps that token alone.
    assert set(_draws(SamplingParams(temperature=1.0, top_p=float(sorted_probs[0]) / 2))) == {BY_RANK[0]}


def test_top_k_and_top_p_together_keep_the_smaller_support() -> None:
    draws = _draws(SamplingParams(temperature=1.0, top_k=2, top_p=0.999))
    assert set(draws) == set(BY_RANK[:2])


def test_temperature_sharpens_and_flattens() -> None:
    cold = Counter(_draws(SamplingParams(temperature=0.05)))
    hot = Counter(_draws(SamplingParams(temperature=100.0)))
    assert cold[BY_RANK[0]] > 300
    assert len(hot) == len(LOGITS)


def test_sample_batch_mixes_greedy_and_seeded_rows() -> None:
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(), SamplingParams(), SamplingParams(temperature=1.0, seed=3)]
    tokens = sample_batch(logits, params, [None, None, make_generator(3)])
    assert tokens[:2] == [1, len(LOGITS) - 1 - 1]
    assert tokens[2] == sample(LOGITS, params[2], make_generator(3))
    with pytest.raises(ValueError, match="one params and generator per row"):
        sample_batch(logits, params[:2], [None, None])


def test_stop_accepts_a_string_or_a_list() -> None:
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"temperature": -0.1}, "temperature=-0.1"),
        ({"temperature": float("nan")}, "temperature=nan"),
        ({"temperature": float("inf")}, "temperature=inf"),
        ({"temperature": "1"}, "temperature='1'"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_p": float("nan")}, "top_p=nan"),
        ({"top_k": -2}, "top_k=-2"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"max_tokens": 0}, "max_tokens=0"),
        ({"max_tokens": True}, "max_tokens=True"),
        ({"stop": [""]}, "stop=['']"),
        ({"stop": [1]}, "stop=[1]"),
        ({"seed": "x"}, "seed='x'"),
    ],
)
def test_bad_values_are_rejected_by_name(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError) as caught:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert named in str(caught.value)


def test_sample_rejects_a_batch_of_logits() -> None:
    with pytest.raises(ValueError, match="one row"):
        sample(LOGITS[None, :], SamplingParams())


@pytest.mark.parametrize(
    "extreme",
    [
        {"temperature": 1e-300},
        {"temperature": 1.0, "top_p": 1e-300},
        {"temperature": 5e-324, "top_p": 5e-324, "top_k": 2},
    ],
)
def test_extreme_but_valid_values_sample_the_argmax_and_spare_the_batch(extreme: dict[str, float]) -> None:
    # Such values used to give inf/nan probabilities and fail every request of the step.
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(0)) * 5
    params = [SamplingParams(**extreme), SamplingParams(temperature=0.7, seed=1), SamplingParams()]  # type: ignore[arg-type]
    tokens = sample_batch(logits, params, [make_generator(1), make_generator(1), None])
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[2] == int(logits[2].argmax())
    assert 0 <= tokens[1] < 300
