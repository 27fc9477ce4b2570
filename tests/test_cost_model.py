"""The simulator's cost model: defaults, YAML round trip and errors, calibration by least squares."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine_adapter.sim.cost_model import CostModel, CostModelError, calibrate


def test_defaults_are_plausible_for_a_7b_model_on_an_a100() -> None:
    model = CostModel()
    assert "A100" in model.name
    # a 2k-token prefill takes a fraction of a second; 32k tokens take seconds
    assert 0.1 < model.prefill_time(2048) < 0.3
    assert 2.0 < model.prefill_time(32768) < 6.0
    # a decode step of one short sequence takes ~10 ms; 64 sequences of 2k tokens ~50 ms
    assert 0.008 < model.decode_step_time(1, 512) < 0.015
    assert 0.03 < model.decode_step_time(64, 64 * 2048) < 0.08


def test_time_formulas() -> None:
    model = CostModel(
        prefill_base_s=1,
        prefill_per_token_s=0.1,
        prefill_attn_s=0.01,
        decode_base_s=2,
        decode_per_seq_s=0.5,
        decode_per_context_token_s=0.001,
    )
    assert model.prefill_time(10) == pytest.approx(1 + 1 + 0.01 * 10 * 5)
    assert model.prefill_time(10, batch=2, cached_tokens=20) == pytest.approx(1 + 1 + 0.01 * 10 * 25 / 2)
    assert model.prefill_time(0) == 0.0
    assert model.decode_step_time(4, 1000) == pytest.approx(2 + 2 + 1)
    assert model.decode_step_time(0, 0) == 0.0
    both = model.step_time(prefill_tokens=10, prefill_batch=1, decode_batch=4, context_tokens=1000)
    assert both == pytest.approx(model.prefill_time(10) + model.decode_step_time(4, 1000) - 1)
    assert model.step_time(decode_batch=4, context_tokens=1000) == model.decode_step_time(4, 1000)
    assert model.step_time() == 0.0


def test_prefix_hits_save_time() -> None:
    model = CostModel()
    full = model.prefill_time(8192)
    half_cached = model.prefill_time(4096, cached_tokens=4096)
    assert half_cached < full
    assert half_cached > model.prefill_time(4096)


def test_yaml_round_trip(tmp_path: Path) -> None:
    model = CostModel(name="tiny on cpu", prefill_per_token_s=1.25e-4, decode_base_s=0.002)
    path = tmp_path / "cost.yaml"
    model.to_yaml(path)
    assert CostModel.from_yaml(path) == model
    assert CostModel.from_dict(model.to_dict()) == model


def test_yaml_partial_and_empty_files_keep_defaults(tmp_path: Path) -> None:
    path = tmp_path / "cost.yaml"
    path.write_text("decode_base_s: 0.02\nprefill_attn_s: 0\n")
    model = CostModel.from_yaml(path)
    assert model.decode_base_s == 0.02 and model.prefill_attn_s == 0.0
    assert model.prefill_per_token_s == CostModel().prefill_per_token_s
    path.write_text("")
    assert CostModel.from_yaml(path) == CostModel()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "decode_base: 0.01\nprefil_attn_s: 1\n",
            "unknown key(s) decode_base, prefil_attn_s; keys: name, prefill_base_s",
        ),
        ("decode_base_s: -0.01\n", "decode_base_s must be a finite number >= 0"),
        ("decode_base_s: fast\n", "decode_base_s must be a finite number >= 0 (seconds), got 'fast'"),
        ("decode_base_s: .nan\n", "decode_base_s must be a finite number"),
        ("decode_base_s: true\n", "decode_base_s must be"),
        ("name: 7\n", "name must be a string"),
        ("- 1\n- 2\n", "expected a mapping of cost-model keys, got list"),
        ("decode_base_s: [0.01\n", "bad YAML"),
    ],
)
def test_bad_yaml_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cost.yaml"
    path.write_text(text)
    with pytest.raises(CostModelError) as caught:
        CostModel.from_yaml(path)
    assert str(caught.value).startswith(str(path))
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_missing_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(CostModelError, match=r"nowhere\.yaml: no such file"):
        CostModel.from_yaml(tmp_path / "nowhere.yaml")


def test_constructor_validates() -> None:
    with pytest.raises(CostModelError, match="prefill_per_token_s"):
        CostModel(prefill_per_token_s=-1.0)
    assert CostModel(decode_base_s=1).decode_base_s == 1.0


TRUE = CostModel(
    name="true",
    prefill_base_s=0.004,
    prefill_per_token_s=6e-5,
    prefill_attn_s=2e-9,
    decode_base_s=0.007,
    decode_per_seq_s=1e-4,
    decode_per_context_token_s=2.5e-7,
)


def _samples(noise: float, seed: int = 0) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    rng = np.random.default_rng(seed)
    prefill: list[tuple[float, ...]] = []
    for _ in range(200):
        tokens, batch, cached = (
            int(rng.integers(16, 16384)),
            int(rng.integers(1, 9)),
            int(rng.integers(0, 8192)),
        )
        seconds = TRUE.prefill_time(tokens, batch, cached) * (1 + noise * rng.standard_normal())
        prefill.append((tokens, batch, seconds, cached))
    decode: list[tuple[float, ...]] = []
    for _ in range(200):
        batch = int(rng.integers(1, 129))
        context = batch * int(rng.integers(16, 4096))
        seconds = TRUE.decode_step_time(batch, context) * (1 + noise * rng.standard_normal())
        decode.append((context, batch, seconds))
    return prefill, decode


@pytest.mark.parametrize(("noise", "rel"), [(0.0, 1e-6), (0.02, 0.1)])
def test_calibration_recovers_known_coefficients(noise: float, rel: float) -> None:
    prefill, decode = _samples(noise)
    fitted = calibrate(prefill, decode, name="fit")
    assert fitted.name == "fit"
    for key, value in TRUE.to_dict().items():
        if key != "name":
            assert getattr(fitted, key) == pytest.approx(value, rel=rel), key


def test_calibration_keeps_what_the_samples_cannot_tell() -> None:
    # batch 1 only: per-sequence decode cost is confounded with the base; no prefill samples at all
    decode = [(context, 1, TRUE.decode_step_time(1, context)) for context in range(100, 10_000, 100)]
    base = CostModel(decode_per_seq_s=0.0)
    fitted = calibrate(decode=decode, base=base)
    assert fitted.decode_base_s == pytest.approx(TRUE.decode_base_s + TRUE.decode_per_seq_s)
    assert fitted.decode_per_context_token_s == pytest.approx(TRUE.decode_per_context_token_s)
    assert fitted.decode_per_seq_s == 0.0
    assert fitted.prefill_per_token_s == base.prefill_per_token_s
    assert fitted.name == "calibrated (0 prefill, 99 decode samples)"


def test_calibration_never_returns_negative_coefficients() -> None:
    # times that fall with context would need a negative slope: it is held at 0 instead
    decode = [(context, 1 + context // 1000, 0.01 - 1e-7 * context) for context in range(0, 20_000, 500)]
    fitted = calibrate(decode=decode)
    assert fitted.decode_per_context_token_s == 0.0
    assert all(value >= 0 for key, value in fitted.to_dict().items() if key != "name")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs prefill or decode samples"),
        ({"prefill": [(100, 1)]}, "prefill sample 0: expected 3 numbers or 4 numbers"),
        ({"decode": [(100, 0, 0.01)]}, "batch >= 1"),
        ({"decode": [(100, 1, "fast")]}, "decode sample 0"),
        ({"decode": [(100, 1, -0.01)]}, "must be finite and >= 0"),
    ],
)
def test_bad_samples(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CostModelError, match=message.replace("(", r"\(")):
        calibrate(**kwargs)  # type: ignore[arg-type]


def test_calibrated_model_round_trips(tmp_path: Path) -> None:
    fitted = calibrate(*_samples(0.01))
    path = tmp_path / "calibrated.yaml"
    fitted.to_yaml(path)
    assert CostModel.from_yaml(path) == fitted
