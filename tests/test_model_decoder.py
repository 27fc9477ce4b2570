"""The decoder over the paged pool: the built-in model, batching, shared prefixes, recompute.

The properties the engine relies on: a sequence's logits do not depend on what else is in the
batch, on how its prefill was chunked, or on whether its first blocks were written by another
sequence (prefix caching) or by itself before a preemption (recompute). Logits agree to float
rounding (the padded batch sums in another order); greedy tokens agree exactly.
"""

from __future__ import annotations

import socket

import pytest
import torch

from engine_adapter.model import SAGE_TINY, ByteTokenizer, ForwardBatch, load_model
from engine_adapter.model.decoder import Decoder
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.loader import weights_digest

ATOL = RTOL = 1e-5
BLOCK_SIZE = 4

# sha256 of sage-tiny's parameters (loader.weights_digest) under torch 2.13. The weights come from
# torch.randint on a seeded CPU generator, so this holds on every machine with that torch.
SAGE_TINY_DIGEST = "1a6b154bb6be3be6"


@pytest.fixture(scope="module")
def tiny() -> tuple[Decoder, ByteTokenizer]:
    decoder, tokenizer, config = load_model("sage-tiny", device="cpu")
    assert config == SAGE_TINY
    assert isinstance(tokenizer, ByteTokenizer)
    return decoder, tokenizer


def _pool(decoder: Decoder, num_blocks: int = 128) -> PagedKVPool:
    return decoder.make_pool(num_blocks=num_blocks, block_size=BLOCK_SIZE)


def _blocks(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK_SIZE)


def _prefill(decoder: Decoder, pool: PagedKVPool, ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """Fresh prefill of `ids` in `pool`; returns the block table and the logits of every position."""
    table = pool.allocator.allocate(_blocks(len(ids)))
    out = decoder(ForwardBatch([ids], [0], [table], return_all_logits=True), pool)
    assert out.all_logits is not None
    return table, out.all_logits[0]


def _greedy(decoder: Decoder, pool: PagedKVPool, ids: list[int], steps: int) -> list[int]:
    """Greedy continuation of `ids`, one decode step at a time."""
    table = pool.allocator.allocate(_blocks(len(ids) + steps))
    logits = decoder(ForwardBatch([ids], [0], [table]), pool).logits[0]
    generated: list[int] = []
    for _ in range(steps):
        token = int(logits.argmax())
        generated.append(token)
        start = len(ids) + len(generated) - 1
        logits = decoder(ForwardBatch([[token]], [start], [table]), pool).logits[0]
    return generated


@pytest.mark.slow
def test_sage_tiny_loads_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("sage-tiny tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    decoder, tokenizer, config = load_model("sage-tiny", device="cpu")
    assert config.vocab_size >= tokenizer.vocab_size
    assert decoder.dtype == torch.float32


def test_sage_tiny_weights_are_the_same_on_every_load(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, _ = tiny
    again, _, _ = load_model("sage-tiny", device="cpu")
    digest = weights_digest(decoder)
    assert weights_digest(again) == digest
    assert digest.startswith(SAGE_TINY_DIGEST)


def test_loading_sage_tiny_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    load_model("sage-tiny", device="cpu")
    torch.testing.assert_close(torch.rand(4), expected, atol=0, rtol=0)


@pytest.mark.slow
def test_sage_tiny_output_depends_on_the_context(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    continuations = {
        tuple(_greedy(decoder, _pool(decoder), tokenizer.encode(text), 6))
        for text in ("hello", "goodbye", "12345", "The quick brown fox")
    }
    assert len(continuations) > 1


@pytest.mark.slow
def test_batched_forward_equals_per_sequence_forward(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    # Two sequences already hold a context (then one decode token or a second prefill chunk),
    # two are fresh prefills of different lengths.
    contexts = [tokenizer.encode("a decode step"), tokenizer.encode("chunked prompt, first part"), [], []]
    new_tokens = [
        [65],
        tokenizer.encode(" and the second")[1:],
        tokenizer.encode("x"),
        tokenizer.encode("fresh!"),
    ]

    def run_alone(i: int) -> torch.Tensor:
        pool = _pool(decoder)
        table = pool.allocator.allocate(_blocks(len(contexts[i]) + len(new_tokens[i])))
        if contexts[i]:
            decoder(ForwardBatch([contexts[i]], [0], [table]), pool)
        out = decoder(
            ForwardBatch([new_tokens[i]], [len(contexts[i])], [table], return_all_logits=True), pool
        )
        assert out.all_logits is not None
        return out.all_logits[0]

    alone = [run_alone(i) for i in range(len(contexts))]

    pool = _pool(decoder)
    tables = [
        pool.allocator.allocate(_blocks(len(c) + len(n))) for c, n in zip(contexts, new_tokens, strict=True)
    ]
    for context, table in zip(contexts, tables, strict=True):
        if context:
            decoder(ForwardBatch([context], [0], [table]), pool)
    batch = ForwardBatch(new_tokens, [len(c) for c in contexts], tables, return_all_logits=True)
    together = decoder(batch, pool)
    assert together.all_logits is not None
    assert together.logits.shape == (4, SAGE_TINY.vocab_size)
    for i, expected in enumerate(alone):
        torch.testing.assert_close(together.all_logits[i], expected, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(together.logits[i], expected[-1], atol=ATOL, rtol=RTOL)


@pytest.mark.slow
def test_uniform_decode_batch_equals_single_decodes(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in ("abcdefgh", "ijklmnop", "qrstuvwx")]  # equal lengths
    pool = _pool(decoder)
    tables = [pool.allocator.allocate(_blocks(len(p) + 1)) for p in prompts]
    decoder(ForwardBatch(prompts, [0, 0, 0], tables), pool)
    batched = decoder(ForwardBatch([[1], [2], [3]], [len(p) for p in prompts], tables), pool).logits
    for i, prompt in enumerate(prompts):
        solo_pool = _pool(decoder)
        _, logits = _prefill(decoder, solo_pool, [*prompt, i + 1])
        torch.testing.assert_close(batched[i], logits[-1], atol=ATOL, rtol=RTOL)


def test_shared_prefix_blocks_give_the_logits_of_a_fresh_prefill(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    prefix = tokenizer.encode("You are a helpful assistant.")[: 7 * BLOCK_SIZE]  # whole blocks
    assert len(prefix) % BLOCK_SIZE == 0
    first = [*prefix, *tokenizer.encode("What is 2+2?")[1:]]
    second = [*prefix, *tokenizer.encode("Name a color.")[1:]]

    pool = _pool(decoder)
    # The first sequence is prefilled in a batch with an unrelated one, as it would be in the engine.
    other = tokenizer.encode("unrelated traffic")
    table_first = pool.allocator.allocate(_blocks(len(first)))
    table_other = pool.allocator.allocate(_blocks(len(other)))
    decoder(ForwardBatch([first, other], [0, 0], [table_first, table_other]), pool)

    # The second reuses the first's prefix blocks and prefills only its own suffix.
    shared = table_first[: len(prefix) // BLOCK_SIZE]
    table_second = shared + pool.allocator.allocate(_blocks(len(second)) - len(shared))
    hit = decoder(
        ForwardBatch([second[len(prefix) :]], [len(prefix)], [table_second], return_all_logits=True), pool
    )
    assert hit.all_logits is not None

    _, fresh = _prefill(decoder, _pool(decoder), second)
    torch.testing.assert_close(hit.all_logits[0], fresh[len(prefix) :], atol=ATOL, rtol=RTOL)
    assert torch.equal(hit.all_logits[0].argmax(-1), fresh[len(prefix) :].argmax(-1))


@pytest.mark.slow
def test_recompute_after_preemption_continues_the_same_greedy_tokens(
    tiny: tuple[Decoder, ByteTokenizer],
) -> None:
    decoder, tokenizer = tiny
    prompt = tokenizer.encode("Once upon a time")
    steps = 24
    expected = _greedy(decoder, _pool(decoder), prompt, steps)

    # Preempt after 10 tokens: the blocks are dropped, the sequence is re-prefilled from scratch
    # (prompt + what it had generated) in another pool, then decodes on.
    done = 10
    resumed = _greedy(decoder, _pool(decoder), prompt + expected[:done], steps - done)
    assert expected[:done] + resumed == expected


@pytest.mark.slow
def test_stale_values_in_unwritten_slots_never_reach_the_logits(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    pool = _pool(decoder, num_blocks=16)
    for cache in (*pool.k_cache, *pool.v_cache):  # what a diverged fp16 sequence could leave behind
        cache.fill_(float("nan"))
    short, long = tokenizer.encode("hi"), tokenizer.encode("a longer prompt, padded past")
    tables = [pool.allocator.allocate(_blocks(len(short))), pool.allocator.allocate(_blocks(len(long)))]
    out = decoder(ForwardBatch([short, long], [0, 0], tables), pool)
    assert torch.isfinite(out.logits).all()
    for row, ids in zip(out.logits, (short, long), strict=True):
        torch.testing.assert_close(row, _prefill(decoder, _pool(decoder), ids)[1][-1], atol=ATOL, rtol=RTOL)


def test_forward_rejects_an_inconsistent_batch(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, _ = tiny
    pool = _pool(decoder, num_blocks=8)
    table = pool.allocator.allocate(2)
    with pytest.raises(ValueError, match="empty ForwardBatch"):
        decoder(ForwardBatch([], [], []), pool)
    with pytest.raises(ValueError, match="differ in length"):
        decoder(ForwardBatch([[1]], [0, 0], [table]), pool)
    with pytest.raises(ValueError, match="no new token"):
        decoder(ForwardBatch([[]], [0], [table]), pool)
    with pytest.raises(ValueError, match="cannot hold 9 tokens"):
        decoder(ForwardBatch([[1] * 9], [0], [table]), pool)
    with pytest.raises(ValueError, match="token id 999"):
        decoder(ForwardBatch([[1, 999]], [0], [table]), pool)
    with pytest.raises(ValueError, match="start_position=-1"):
        decoder(ForwardBatch([[1]], [-1], [table]), pool)


def test_forward_rejects_a_pool_that_does_not_fit(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, _ = tiny
    cfg = decoder.config
    wrong = PagedKVPool(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim * 2,
        block_size=BLOCK_SIZE,
        num_blocks=4,
        dtype=torch.float16,  # another K/V dtype alone fits (tests/test_model_precision.py)
        device="cpu",
    )
    with pytest.raises(ValueError, match="does not fit the model"):
        decoder(ForwardBatch([[1]], [0], [wrong.allocator.allocate(1)]), wrong)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_follows_float32(dtype: torch.dtype, tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    half, _, _ = load_model("sage-tiny", device="cpu", dtype=dtype)
    assert half.dtype == dtype
    pool = _pool(half)
    assert pool.dtype == dtype
    ids = tokenizer.encode("half precision")
    _, logits = _prefill(half, pool, ids)
    _, reference = _prefill(decoder, _pool(decoder), ids)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # Agreement is loose (a few bits of mantissa) but far from chance.
    cosine = torch.nn.functional.cosine_similarity(logits, reference, dim=-1)
    assert bool((cosine > 0.98).all()), cosine


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(tiny: tuple[Decoder, ByteTokenizer]) -> None:
    decoder, tokenizer = tiny
    on_gpu, _, _ = load_model("sage-tiny", device="cuda")
    ids = tokenizer.encode("on the accelerator")
    _, gpu = _prefill(on_gpu, _pool(on_gpu), ids)
    _, cpu = _prefill(decoder, _pool(decoder), ids)
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-3, rtol=1e-3)
