"""Packed weights (issue 27): the dense linears on oneDNN's prepacked layout.

`PackedLinear` against ``F.linear`` on random shapes, dtypes, biases and batch sizes (one packed
copy serves every batch size); the packed decoder's logits against the plain decoder's,
teacher-forced on sage-tiny, and its greedy tokens alike; which layers are packed (quantized ones
keep their kernels); one-line refusals; the engine reports it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from engine_adapter.model import ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.packed import (
    PACKED_WEIGHTS_CHOICES,
    PROBE_ROWS,
    PackedLinear,
    crossover,
    first_of_winning_run,
    pack_decoder,
)
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.config.values import PACKED_WEIGHTS

PROMPT = list(b"packed weights, the same numbers")
FORCED = [101, 32, 116, 101, 115, 116, 33]


@settings(deadline=None)
@given(
    rows=st.integers(1, 40),
    lead=st.sampled_from([(), (3,)]),
    in_features=st.integers(1, 96),
    out_features=st.integers(1, 130),
    bias=st.booleans(),
    min_rows=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_a_packed_linear_equals_f_linear(
    rows: int,
    lead: tuple[int, ...],
    in_features: int,
    out_features: int,
    bias: bool,
    min_rows: int,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    packed = PackedLinear(linear, min_rows)  # calls below min_rows rows take F.linear
    for batch in (rows, 1, rows + 7):  # one packed weight, any number of rows
        x = torch.randn(*lead, batch, in_features)
        expected = F.linear(x, linear.weight, linear.bias)
        got = packed(x)
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_pack_where_onednn_can() -> None:
    """bf16 packs on CPUs with AVX512-BW or AVX-NE-CONVERT; elsewhere ``on`` is a one-line refusal
    (it was a RuntimeError from oneDNN's reorder) and ``auto`` leaves the model plain."""
    torch.manual_seed(0)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        decoder = load_model("sage-tiny", device="cpu", dtype="bfloat16")[0]
        assert pack_decoder(decoder, "auto") == 0
        with pytest.raises(ValueError, match="AVX512-BW or AVX-NE-CONVERT"):
            pack_decoder(decoder, "on")
        return
    linear = nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    got = PackedLinear(linear)(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(
        got.float(), F.linear(x, linear.weight, linear.bias).float(), rtol=0.02, atol=0.05
    )


def _teacher_forced(decoder: Decoder) -> torch.Tensor:
    pool = decoder.make_pool(num_blocks=8, block_size=16)
    table = pool.allocator.allocate(4)
    rows = [decoder(ForwardBatch([PROMPT], [0], [table]), pool).logits[0]]
    for i, token in enumerate(FORCED):
        rows.append(decoder(ForwardBatch([[token]], [len(PROMPT) + i], [table]), pool).logits[0])
    return torch.stack(rows)


@pytest.mark.parametrize("from_rows", [1, 4])  # every call packed; the prefill packed, decode plain
def test_the_packed_decoder_follows_the_plain_one(from_rows: int) -> None:
    plain, _, config = load_model("sage-tiny", device="cpu", dtype="float32")
    packed, _, _ = load_model("sage-tiny", device="cpu", dtype="float32")
    linears = 7 * config.num_hidden_layers + 1  # q k v o gate up down per layer, and the lm head
    assert pack_decoder(packed, "on", min_rows=lambda _linear: from_rows) == linears
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert packed.packed_weights == f"{linears} of {linears} linears" and plain.packed_weights == "no"
    expected, got = _teacher_forced(plain), _teacher_forced(packed)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_a_shape_where_packing_never_wins_stays_plain() -> None:
    decoder, _, config = load_model("sage-tiny", device="cpu", dtype="float32")
    head_shape = (config.vocab_size, config.hidden_size)
    only_head = pack_decoder(
        decoder, "on", min_rows=lambda m: 2 if (m.out_features, m.in_features) == head_shape else None
    )
    assert only_head == 1 and isinstance(decoder.lm_head, PackedLinear) and decoder.lm_head.min_rows == 2
    assert sum(type(m) is nn.Linear for m in decoder.modules()) == 7 * config.num_hidden_layers


def test_the_crossover_is_where_the_last_run_of_wins_starts() -> None:
    probes = (1, 2, 4, 8)
    assert first_of_winning_run(probes, [False, False, True, True]) == 4
    assert first_of_winning_run(probes, [True, True, True, True]) == 1
    assert first_of_winning_run(probes, [False, True, False, True]) == 8  # a lone win earlier is noise
    assert first_of_winning_run(probes, [True, True, True, False]) is None
    rows = crossover(nn.Linear(96, 320), repeats=1)  # the real timing: one of the probes, or never
    assert rows is None or rows in PROBE_ROWS


def test_quantized_layers_keep_their_kernels_and_auto_packs_only_what_it_can() -> None:
    quantized, _, _ = load_model("sage-tiny", device="cpu", quantization="int8", packed_weights="auto")
    assert not any(isinstance(m, PackedLinear) for m in quantized.modules())  # all int8, head too
    assert quantized.packed_weights == "no"  # every linear is int8, the head too
    half, _, _ = load_model("sage-tiny", device="cpu", dtype="float16")
    assert pack_decoder(half, "auto") == 0 and half.packed_weights == "no"
    with pytest.raises(ValueError, match=r"float32 or bfloat16, not torch\.float16") as raised:
        pack_decoder(half, "on")
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match="packed weights 'yes' is not one of auto, on, off"):
        pack_decoder(half, "yes")


def test_config_choices_and_errors() -> None:
    assert PACKED_WEIGHTS == PACKED_WEIGHTS_CHOICES
    with pytest.raises(ConfigError) as raised:
        EngineConfig(packed_weights="maybe")
    assert "packed weights" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.slow
def test_the_engine_reports_packed_weights_and_decodes_as_without() -> None:
    from engine_adapter.model.sampling import SamplingParams
    from engine_adapter.serving.engine import Engine

    outputs = {}
    for mode in ("off", "on"):
        config = EngineConfig(
            model="sage-tiny", device="cpu", num_blocks=32, packed_weights=mode, batch_invariant="off"
        )
        engine = Engine(config)
        engine.start()
        try:
            decoder = engine.decoder
            linears = sum(isinstance(m, (nn.Linear, PackedLinear)) for m in decoder.modules())
            packed = sum(isinstance(m, PackedLinear) for m in decoder.modules())
            expected = "no" if mode == "off" else f"{packed} of {linears} linears"
            assert engine.info()["packed_weights"] == expected  # sage-tiny's tiny shapes may keep F.linear
            outputs[mode] = (
                engine.submit(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True)).result(60).token_ids
            )
        finally:
            engine.shutdown()
    assert outputs["on"] == outputs["off"]


def test_calls_below_the_crossover_take_f_linear_and_the_rest_the_packed_kernel() -> None:
    from torch.profiler import profile

    packed = PackedLinear(nn.Linear(32, 48), min_rows=4)

    def ops(rows: int) -> set[str]:
        with profile() as prof:
            packed(torch.randn(rows, 32))
        return {e.name for e in prof.events()}

    assert "mkldnn::_linear_pointwise" not in ops(3) and "aten::linear" in ops(3)
    assert "mkldnn::_linear_pointwise" in ops(4) and "aten::linear" not in ops(4)
