"""The static decode step (engine_adapter.model.graphs) against Decoder.forward's own path.

On the CPU the padded static step runs eagerly: its logits must equal the eager forward's, and
the pool afterwards must hold the same K/V at the real slots and nothing new anywhere a sequence
owns but the new tokens. The CUDA tests (graph replay, the engine with and without graphs) run
on a GPU machine only.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_adapter.model import ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.graphs import DecodeGraphs, batch_bucket, context_bucket, enable_cuda_graphs
from engine_adapter.model.kv_pool import PagedKVPool

BLOCK = 16
NUM_BLOCKS = 96


@pytest.fixture(scope="module", name="decoder")
def decoder_fixture() -> Decoder:
    decoder, _, _ = load_model("sage-tiny", device="cpu", dtype="float32")
    return decoder


def _scenario(
    decoder: Decoder, contexts: list[int], *, shared: int = 0, kv_dtype: str = "float32", seed: int = 0
) -> tuple[PagedKVPool, ForwardBatch]:
    """A pool of random K/V and a decode batch whose sequences hold `contexts` tokens; with
    `shared`, every sequence's first `shared` blocks are sequence 0's (a shared prefix). Block 0
    is stale: NaN that no sequence owns (a key read from it would poison the logits)."""
    torch.manual_seed(seed)
    pool = decoder.make_pool(num_blocks=NUM_BLOCKS, block_size=BLOCK, kv_dtype=kv_dtype)
    assert pool.allocator.allocate(1) == [0]
    for layer in range(pool.num_layers):
        for t in pool.flat(layer):
            t.normal_(0.0, 1.0)
            t[:BLOCK] = float("nan")
    tables: list[list[int]] = []
    for ctx in contexts:
        need = ctx // BLOCK + 1  # room for the new token
        prefix = tables[0][:shared] if tables and shared else []
        tables.append(prefix + pool.allocator.allocate(max(need - len(prefix), 1)))
    ids = torch.randint(0, decoder.config.vocab_size, (len(contexts),)).tolist()
    offsets = [(7 * i) % 5 for i in range(len(contexts))]
    return pool, ForwardBatch([[t] for t in ids], list(contexts), tables, position_offsets=offsets)


def _snapshot(pool: PagedKVPool) -> list[torch.Tensor]:
    return [t.clone() for layer in range(pool.num_layers) for t in pool.flat(layer)]


def _restore(pool: PagedKVPool, saved: list[torch.Tensor]) -> None:
    flats = [t for layer in range(pool.num_layers) for t in pool.flat(layer)]
    for dst, src in zip(flats, saved, strict=True):
        dst.copy_(src)


def _compare(
    decoder: Decoder, pool: PagedKVPool, batch: ForwardBatch, compiled_math: bool = False, **buckets: int
) -> None:
    """Eager forward, then the static step from the same pool: the same logits and K/V."""
    before = _snapshot(pool)
    decoder.graphs = None
    eager = decoder(batch, pool).logits
    after_eager = _snapshot(pool)
    _restore(pool, before)
    graphs = enable_cuda_graphs(decoder, pool, compiled_math=compiled_math, **buckets)
    try:
        assert graphs.fits(batch, pool)
        static = decoder(batch, pool).logits
    finally:
        decoder.graphs = None
    after_static = _snapshot(pool)
    assert static.shape == eager.shape
    loose = pool.dtype != torch.float32  # a K/V rounded to bf16 may land one step apart
    tol = 1e-3 if loose else 1e-5
    torch.testing.assert_close(static, eager, rtol=tol, atol=tol)
    real = NUM_BLOCKS * BLOCK  # slots before the scratch block
    new_slots = [
        t[s // BLOCK] * BLOCK + s % BLOCK
        for t, s in zip(batch.block_tables, batch.start_positions, strict=True)
    ]
    untouched = torch.ones(real, dtype=torch.bool)
    untouched[new_slots] = False
    for b, e, s in zip(before, after_eager, after_static, strict=True):
        # nothing else changed (NaN == NaN here: block 0 keeps its stale NaN)
        torch.testing.assert_close(s[:real][untouched], b[:real][untouched], rtol=0, atol=0, equal_nan=True)
        assert not torch.equal(s[new_slots], b[new_slots])  # the new tokens were written
        torch.testing.assert_close(s[:real], e[:real], rtol=tol * 10, atol=tol * 10, equal_nan=True)


@pytest.mark.parametrize(
    ("contexts", "shared"),
    [
        ([0], 0),  # one token, nothing cached
        ([37], 0),  # batch 1 (bucket 1)
        ([15, 16, 17], 0),  # pads to 4; contexts on both sides of a block boundary
        ([31, 5, 48, 33, 2], 0),  # pads to 8; ragged
        ([40, 33, 47, 35, 36, 60, 34, 41], 2),  # a full bucket; 2 shared prefix blocks
    ],
)
def test_static_step_equals_the_forward(decoder: Decoder, contexts: list[int], shared: int) -> None:
    pool, batch = _scenario(decoder, contexts, shared=shared)
    _compare(decoder, pool, batch, min_context=16, max_context=256)


def test_static_step_with_another_kv_dtype_and_the_default_buckets(decoder: Decoder) -> None:
    pool, batch = _scenario(decoder, [20, 3, 45], kv_dtype="bfloat16", seed=1)
    _compare(decoder, pool, batch)


@pytest.mark.slow
def test_static_step_with_compiled_math_equals_the_forward(decoder: Decoder) -> None:
    """inductor's kernels for the dense math (what --compile puts inside the CUDA graph)."""
    pool, batch = _scenario(decoder, [31, 5, 48], seed=2)
    _compare(decoder, pool, batch, compiled_math=True, min_context=16, max_context=256)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(
    contexts=st.lists(st.integers(0, 70), min_size=1, max_size=9),
    shared=st.integers(0, 1),
    seed=st.integers(0, 1000),
)
def test_static_step_on_random_batches(decoder: Decoder, contexts: list[int], shared: int, seed: int) -> None:
    shared = shared if min(contexts) >= BLOCK else 0  # a shared block must be full in every sequence
    pool, batch = _scenario(decoder, contexts, shared=shared, seed=seed)
    _compare(decoder, pool, batch, min_context=32, max_context=128)


def test_buckets() -> None:
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 5, 33, 64, 65)] == [1, 2, 4, 8, 64, 64, None]
    assert [batch_bucket(n, 100) for n in (65, 100, 101)] == [128, 128, None]
    totals = (1, 256, 257, 600, 1000, 1001)
    assert [context_bucket(t, 256, 1000) for t in totals] == [256, 256, 512, 768, 1000, None]
    assert [context_bucket(t, 16, 4096) for t in (129, 200, 257, 600)] == [256, 256, 512, 1024]


def test_other_batches_stay_eager(decoder: Decoder) -> None:
    pool, batch = _scenario(decoder, [20, 30])
    graphs = DecodeGraphs(decoder, pool, max_batch=2, min_context=16, max_context=64)
    assert graphs.fits(batch, pool)
    variants = [
        ForwardBatch([[1, 2], [3]], batch.start_positions, batch.block_tables),  # a prefill chunk
        ForwardBatch(batch.token_ids, batch.start_positions, batch.block_tables, return_all_logits=True),
        ForwardBatch(batch.token_ids, batch.start_positions, batch.block_tables, pool_hidden=[True, False]),
        # past max_batch, then past max_context
        ForwardBatch(batch.token_ids * 2, batch.start_positions * 2, batch.block_tables * 2),
        ForwardBatch(batch.token_ids, [20, 64], [batch.block_tables[0], pool.allocator.allocate(5)]),
    ]
    for variant in variants:
        assert not graphs.fits(variant, pool)
    decoder.graphs = graphs
    try:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            decoder(ForwardBatch([[decoder.config.vocab_size], [0]], [20, 30], batch.block_tables), pool)
    finally:
        decoder.graphs = None
    assert not graphs.fits(batch, decoder.make_pool(num_blocks=8, block_size=BLOCK))  # another pool


def test_the_scratch_block_is_no_sequences(decoder: Decoder) -> None:
    pool = decoder.make_pool(num_blocks=4, block_size=BLOCK)
    assert pool.k_cache[0].shape[0] == 4  # the scratch block is not in the visible cache
    assert pool.flat(0)[0].shape[0] == 5 * BLOCK
    assert pool.scratch_slots == range(4 * BLOCK, 5 * BLOCK)
    assert sorted(pool.allocator.allocate(4)) == [0, 1, 2, 3]  # never handed out


def test_a_padded_step_writes_only_the_scratch_block(decoder: Decoder) -> None:
    pool, batch = _scenario(decoder, [10])
    before = _snapshot(pool)
    graphs = enable_cuda_graphs(decoder, pool, min_context=16, max_context=64)
    decoder.graphs = None
    graphs.capture([3], 10)  # CPU: fills the padding buffers; no graph to capture
    graphs._step(graphs._bucket(4, 16))  # the padding-only bucket, as a warm-up before a capture runs it
    graphs.run(batch)  # bucket 1: no padding
    real = NUM_BLOCKS * BLOCK
    new_slot = batch.block_tables[0][0] * BLOCK + 10
    others = torch.arange(real) != new_slot
    for b, a in zip(before, _snapshot(pool), strict=True):
        torch.testing.assert_close(a[:real][others], b[:real][others], rtol=0, atol=0, equal_nan=True)
        assert not torch.equal(a[new_slot], b[new_slot])
        assert not torch.equal(a[real:], b[real:])  # the padded rows wrote the scratch block
    assert graphs.captured == []  # no graphs on the CPU


def _engine_completions(device: str, graphs: bool | None) -> list[list[int]]:
    """Greedy token ids of a sage-tiny engine (started_engine: 4-token blocks) for a few prompts
    of different lengths, run together; `graphs`: the config's cuda_graphs (None: the default,
    with the static step switched on by hand, which runs it eagerly on the CPU)."""
    from engine_fixtures import started_engine

    from engine_adapter.model.sampling import SamplingParams

    prompts = ["Tell me about caches.", "short", "x" * 50, "another prompt of a few words"]
    config = {} if graphs is None else {"cuda_graphs": graphs}
    engine = started_engine(device=device, dtype="float32", **config)
    try:
        if graphs is None:
            enable_cuda_graphs(engine.decoder, engine.pool, min_context=16, max_context=128)
        assert (engine.decoder.graphs is not None) == (graphs is not False)
        handles = [engine.submit(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts]
        return [h.result(timeout=120).token_ids for h in handles]
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_engine_greedy_completions_alike_with_the_static_step_on_the_cpu() -> None:
    assert _engine_completions("cpu", None) == _engine_completions("cpu", False)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a GPU)")


@needs_cuda
def test_graph_replay_equals_the_eager_forward_on_cuda() -> None:
    eager, _, _ = load_model("sage-tiny", device="cuda", dtype="float32")
    graphed, _, _ = load_model("sage-tiny", device="cuda", dtype="float32")
    prompts = [list(b"a prompt of some length, " * 3), list(b"short"), list(b"x" * 40)]

    captured: list[DecodeGraphs] = []

    def decode(decoder: Decoder, graphs: bool) -> list[torch.Tensor]:
        pool = decoder.make_pool(num_blocks=64, block_size=BLOCK)
        if graphs:
            captured.append(enable_cuda_graphs(decoder, pool, min_context=32, max_context=512))
        tables = [pool.allocator.allocate(8) for _ in prompts]
        tokens = decoder(ForwardBatch(prompts, [0, 0, 0], tables), pool).logits.argmax(-1).tolist()
        positions, out = [len(p) for p in prompts], []
        for i in range(12):
            n = 3 if i % 2 == 0 else 2  # alternate buckets 4 and 2: replays of two graphs
            fb = ForwardBatch([[t] for t in tokens[:n]], positions[:n], tables[:n])
            logits = decoder(fb, pool).logits
            out.append(logits)
            tokens[:n] = logits.argmax(-1).tolist()
            positions[:n] = [p + 1 for p in positions[:n]]
        return out

    want, got = decode(eager, False), decode(graphed, True)
    assert graphed.graphs is captured[0] and captured[0].captured == [(2, 96), (4, 96)]
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.slow
def test_engine_greedy_completions_alike_with_and_without_graphs() -> None:
    assert _engine_completions("cuda", True) == _engine_completions("cuda", False)
