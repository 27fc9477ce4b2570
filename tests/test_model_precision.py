"""Precision and weights (issue 27, item 2): dtypes, the KV dtype, weight-only int8/int4, compile.

The decoder in each dtype against the float32 decoder on sage-tiny, teacher-forced (the same
tokens fed to both, so a greedy divergence never compares different contexts); the quantized
linears against their dequantized weights; the KV pool in another dtype than the model; the
attention's in-place read of the pool against its gather; `auto` from CPU flags; the GGUF's Q4_1
weights taken as stored; compiled and eager greedy tokens alike.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_fixtures import SMOLLM2, needs_smollm2

from engine_adapter.model import ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.precision import (
    DTYPE_CHOICES,
    QUANTIZATION_CHOICES,
    auto_dtype,
    cpu_flags,
    has_native_bf16,
    run_dtype,
)
from engine_adapter.model.quant import GROUP_SIZE, KERNEL_DTYPE, Int4Linear, Int8Linear, Q4Groups
from engine_adapter.serving.config import ConfigError, EngineConfig
from engine_adapter.serving.config.values import DTYPES, QUANTIZATIONS

PROMPT = list(b"a test of precision, with a few more words")
# Tokens fed after the prompt, one decode step each (teacher forcing).
FORCED = [101, 32, 116, 101, 115, 116]


def _teacher_forced(decoder: Decoder, pool: PagedKVPool, table: list[int] | None = None) -> torch.Tensor:
    """Logits ``[1 + len(FORCED), vocab]``: after the prompt's prefill, then after each forced token."""
    table = table if table is not None else pool.allocator.allocate(4)
    rows = [decoder(ForwardBatch([PROMPT], [0], [table]), pool).logits[0]]
    for i, token in enumerate(FORCED):
        rows.append(decoder(ForwardBatch([[token]], [len(PROMPT) + i], [table]), pool).logits[0])
    return torch.stack(rows)


@pytest.fixture(scope="module", name="reference")
def reference_fixture() -> torch.Tensor:
    decoder, _, _ = load_model("sage-tiny", device="cpu", dtype="float32")
    return _teacher_forced(decoder, decoder.make_pool(num_blocks=8, block_size=16))


# Logits of sage-tiny are of order 1 (max about 3.7): bf16 keeps 8 bits of mantissa, fp16 11.
@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "atol"), [("bfloat16", 0.15), ("float16", 0.02)])
def test_each_dtype_follows_float32(dtype: str, atol: float, reference: torch.Tensor) -> None:
    decoder, _, _ = load_model("sage-tiny", device="cpu", dtype=dtype)
    assert decoder.dtype == run_dtype(dtype, "cpu")
    pool = decoder.make_pool(num_blocks=8, block_size=16)
    assert pool.dtype == decoder.dtype  # the pool follows the model unless told otherwise
    logits = _teacher_forced(decoder, pool)
    torch.testing.assert_close(logits, reference, atol=atol, rtol=0)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_dtype", "kv_dtype", "atol"),
    [
        ("float32", "bfloat16", 0.05),
        ("float32", "float16", 0.01),
        ("bfloat16", "float32", 0.15),
    ],
)
def test_a_kv_dtype_other_than_the_models(
    model_dtype: str, kv_dtype: str, atol: float, reference: torch.Tensor
) -> None:
    decoder, _, _ = load_model("sage-tiny", device="cpu", dtype=model_dtype)
    pool = decoder.make_pool(num_blocks=8, block_size=16, kv_dtype=kv_dtype)
    assert pool.dtype == run_dtype(kv_dtype, "cpu") != decoder.dtype
    logits = _teacher_forced(decoder, pool)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference, atol=atol, rtol=0)


@pytest.mark.slow
def test_the_in_place_read_equals_the_gather(reference: torch.Tensor) -> None:
    """One sequence on consecutive blocks reads a view of the pool; on scattered blocks it gathers."""
    decoder, _, _ = load_model("sage-tiny", device="cpu")
    pool = decoder.make_pool(num_blocks=16, block_size=16)
    scattered = _teacher_forced(decoder, pool, [9, 2, 14, 5])
    in_place = _teacher_forced(decoder, pool, [3, 4, 5, 6])
    torch.testing.assert_close(in_place, scattered, atol=1e-5, rtol=0)
    torch.testing.assert_close(in_place, reference, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(("quantization", "min_cosine"), [("int8", 0.999), ("int4", 0.97)])
def test_quantized_decoder_follows_float32(
    quantization: str, min_cosine: float, reference: torch.Tensor
) -> None:
    decoder, _, _ = load_model("sage-tiny", device="cpu", quantization=quantization)
    assert decoder.quantization == quantization
    assert isinstance(decoder.lm_head, Int8Linear)
    expected = Int4Linear if quantization == "int4" else Int8Linear
    assert isinstance(decoder.layers[0].mlp.up_proj, expected)
    logits = _teacher_forced(decoder, decoder.make_pool(num_blocks=8, block_size=16))
    cosine = torch.nn.functional.cosine_similarity(logits, reference, dim=-1)
    assert bool((cosine > min_cosine).all()), cosine


@settings(max_examples=25, deadline=None)
@given(
    out=st.integers(1, 8).map(lambda k: 16 * k),
    groups=st.integers(1, 6),
    rows=st.integers(1, 9),
    seed=st.integers(0, 2**16),
)
def test_quantized_linears_match_their_dequantized_weights(
    out: int, groups: int, rows: int, seed: int
) -> None:
    """Each quantized linear equals its dequantized weight applied to the bfloat16-rounded input
    (the kernels' activation dtype), to bfloat16's rounding of the output."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, groups * GROUP_SIZE, generator=gen)
    x = torch.randn(rows, groups * GROUP_SIZE, generator=gen)
    bias = torch.randn(out, generator=gen)
    x_kernel = x.to(KERNEL_DTYPE).float()

    def close(actual: torch.Tensor, dequantized: torch.Tensor) -> None:
        # bfloat16 rounds what the kernel sums, so its error scales with the sum of the terms'
        # magnitudes, not with the result: where terms cancel, a bound from |result| fails.
        expected = x_kernel @ dequantized.T + bias
        magnitude = x_kernel.abs() @ dequantized.abs().T + bias.abs()
        assert actual.dtype == torch.float32
        assert bool(((actual - expected).abs() <= 2**-7 * (magnitude + 1)).all()), (
            (actual - expected).abs().max()
        )

    int8 = Int8Linear(weight, bias, torch.float32)
    dequantized8 = int8.qweight.float() * int8.scales.float()[:, None]
    # half a step, but where the row's largest weight was clamped to 127 (bfloat16 rounded its scale down)
    assert bool(((dequantized8 - weight).abs() <= int8.scales.float()[:, None] * 0.51).all())
    close(int8(x), dequantized8)

    q4 = Q4Groups.quantize(weight)
    step = q4.scales.repeat_interleave(GROUP_SIZE, dim=1)
    assert bool(((q4.dequantized() - weight).abs() <= step / 2 + 1e-5).all())
    int4 = Int4Linear(q4, bias, torch.float32)
    scale, zero = (int4.scales_zeros.float()[..., i].T.repeat_interleave(GROUP_SIZE, dim=1) for i in (0, 1))
    dequantized4 = (q4.codes.float() - 8) * scale + zero  # the kernel's formula with its bf16 scales
    # bfloat16 moves a scale and a zero by at most 2**-9 of themselves, so an element by at most
    # 2**-9 * (8 * scale + |zero|) (codes - 8 lie in -8..7); a tolerance of twice that. (A bound
    # from the step and the value alone failed where a group's zero was large against its step.)
    bound = 2**-8 * (8 * scale.abs() + zero.abs())
    assert bool(((dequantized4 - q4.dequantized()).abs() <= bound).all())
    close(int4(x), dequantized4)


def test_auto_picks_bf16_only_where_the_cpu_has_it(tmp_path: pytest.TempPathFactory) -> None:
    assert has_native_bf16({"avx512f", "amx_bf16", "amx_tile"})
    assert has_native_bf16({"avx512f", "avx512_bf16"})
    assert not has_native_bf16({"avx512f", "avx2", "fma"})
    assert not has_native_bf16(set())
    assert auto_dtype("cpu", {"sse4_2", "avx512_bf16"}) == torch.bfloat16
    assert auto_dtype("cpu", {"sse4_2", "avx2"}) == torch.float32
    assert auto_dtype("cuda", set()) == torch.bfloat16
    cpuinfo = tmp_path / "cpuinfo"  # type: ignore[operator]
    cpuinfo.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(str(tmp_path / "absent")) == frozenset()  # type: ignore[operator]
    assert run_dtype("auto", "cpu") == auto_dtype("cpu")


def test_config_choices_are_the_models() -> None:
    assert DTYPES == DTYPE_CHOICES
    assert QUANTIZATIONS == QUANTIZATION_CHOICES


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("dtype", "float64", "a dtype: auto, float32, bfloat16, float16"),
        ("kv_dtype", "int8", "a KV cache dtype: auto"),
        ("quantization", "int3", "a quantization: none, int8, int4"),
        ("compile", "maybe", "compile"),
    ],
)
def test_invalid_values_give_one_line_errors(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        EngineConfig(**{key: value})
    assert expected in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_loader_refuses_bad_precision_in_one_line() -> None:
    for kwargs, expected in [
        ({"quantization": "int3"}, "quantization 'int3' is not one of none, int8, int4"),
        ({"dtype": "float64"}, "dtype 'float64' is not one of"),
        ({"quantization": "int8", "device": "meta"}, "runs on the CPU only"),
    ]:
        with pytest.raises(ValueError, match=expected) as raised:
            load_model("sage-tiny", **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_engine_builds_and_reports_its_precision() -> None:
    from engine_adapter.serving.engine import Engine

    config = EngineConfig(
        model="sage-tiny",
        device="cpu",
        num_blocks=32,
        dtype="float32",
        kv_dtype="bfloat16",
        quantization="int8",
    )
    engine = Engine(config)
    assert engine.pool.dtype == torch.bfloat16
    info = engine.info()
    assert {k: info[k] for k in ("dtype", "kv_dtype", "quantization", "compile")} == {
        "dtype": "float32",
        "kv_dtype": "bfloat16",
        "quantization": "int8",
        "compile": None,
    }


@pytest.mark.slow
@needs_smollm2
def test_q4_1_codes_are_the_files_values() -> None:
    """Unpacking a Q4_1 tensor's nibbles, scales and minima gives what gguf dequantizes."""
    from gguf.quants import dequantize

    from engine_adapter.model import gguf_file

    assert SMOLLM2 is not None
    contents = gguf_file.read_gguf(SMOLLM2)
    tensors = [t for t in contents.reader.tensors if t.tensor_type.name == "Q4_1"][:3]
    assert tensors
    for tensor in tensors:
        stored = gguf_file.q4_1_codes(tensor)
        assert stored is not None
        codes, scales, minima = (torch.from_numpy(a.copy()) for a in stored)
        assert int(codes.max()) <= 15
        groups = Q4Groups(codes, scales.float(), minima.float())
        expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
        torch.testing.assert_close(groups.dequantized(), expected, atol=1e-6, rtol=1e-6)
    f32 = next(t for t in contents.reader.tensors if t.tensor_type.name == "F32")
    assert gguf_file.q4_1_codes(f32) is None


@pytest.mark.slow
@needs_smollm2
def test_int4_on_the_gguf_runs_its_own_weights() -> None:
    """Every layer's int4 weight is the file's Q4_1 (row-unpermuted for Q and K): the int4 linear
    equals the float32 model's linear, whose weights are the same Q4_1 dequantized, to bfloat16
    rounding (a re-quantization of the float weights or a wrong row order would be far off)."""
    torch.set_num_threads(1)
    float_model, _, _ = load_model("smollm2-135m", device="cpu")
    int4_model, _, _ = load_model("smollm2-135m", device="cpu", quantization="int4")
    x = torch.randn(3, float_model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in (0, len(float_model.layers) - 1):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
            exact = float_model.layers[layer].get_submodule(name)
            packed = int4_model.layers[layer].get_submodule(name)
            assert isinstance(packed, Int4Linear)
            h = x if name != "mlp.down_proj" else torch.randn(3, float_model.config.intermediate_size)
            # the codes are the file's; its float16 scales and the input are rounded to bfloat16
            expected = exact(h.to(KERNEL_DTYPE).float())
            torch.testing.assert_close(packed(h), expected, atol=0.02 * float(expected.abs().max()), rtol=0)


@pytest.mark.slow
def test_compiled_and_eager_decode_the_same_tokens() -> None:
    eager, _, _ = load_model("sage-tiny", device="cpu")
    compiled, _, _ = load_model("sage-tiny", device="cpu")
    assert compiled.compile_step() == "inductor"

    def greedy(decoder: Decoder) -> list[list[int]]:
        pool = decoder.make_pool(num_blocks=32, block_size=16)
        prompts = [PROMPT, PROMPT[:7], list(b"x")]
        tables = [pool.allocator.allocate(4) for _ in prompts]
        tokens = decoder(ForwardBatch(prompts, [0, 0, 0], tables), pool).logits.argmax(-1).tolist()
        positions, out = [len(p) for p in prompts], [tokens]
        for _ in range(6):
            logits = decoder(ForwardBatch([[t] for t in tokens], positions, tables), pool).logits
            tokens, positions = logits.argmax(-1).tolist(), [p + 1 for p in positions]
            out.append(tokens)
        return out

    assert greedy(compiled) == greedy(eager)
    assert compiled.layers[0].compiled is not None
