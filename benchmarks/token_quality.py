"""Token-level eviction on the real model: needle-in-a-haystack accuracy, memory and cost.

RULER niah_single style, seeded: varied filler sentences, one needle "One of the special magic
numbers for KEY is: VALUE." (a 5-7 digit value) at a depth of 10-90 %, the question after the
context, in SmolLM2-135M-Instruct's chat template, the answer primed with "The special magic
number for KEY mentioned in the provided text is". A row is correct when its greedy answer
(12 tokens) contains the value.

Two modes: query-agnostic (the context is compressed, then the question is prefilled on top,
as kvpress's pipeline does) and query-aware (the whole prompt with the question is compressed).
One prefill per sample and mode serves every (policy, ratio) row: each row compresses a copy of
the prefilled cache (`SequenceKV.clone`).

Reference rows (``--kvpress``, needs the ``kvpress`` and ``hf`` extras): transformers runs the
same prompt ids once per sample and mode, the inputs of every attention layer are kept, and
each press's own ``compress`` is applied to a copy of each layer's cache, which is what its
forward hook does during prefill (compression after a layer's attention does not change what
later layers see). Then the question (query-agnostic) and greedy decoding continue at the
original positions. kvpress's H2O (ObservedAttentionPress) needs eager attention's full T x T
weights of every layer and is left out of the reference rows.

Also printed: blocks of the compressed sequence vs the uncompressed one (from the pool) and the
compression time against the prefill time, per policy.

    python benchmarks/token_quality.py --lengths 1024,2048 --samples 3 --kvpress
    python benchmarks/token_quality.py --lengths 4096 --samples 1 --ratios 0.5 --modes agnostic
    python benchmarks/token_quality.py --pressure       # only the engine under memory pressure

``--pressure``: two generations (~500-token prompts, 200 tokens each) at once in the engine on a
pool that holds one and a half of them, with ``--token-eviction none`` and then each policy:
preemptions, compressions, and whether both complete.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

from engine_adapter.model.chat_template import ChatMessage, render_chat
from engine_adapter.model.decoder import AttentionObserver, Decoder, ForwardBatch
from engine_adapter.model.kv_pool import PagedKVPool
from engine_adapter.model.loader import load_model
from engine_adapter.model.tokenizer import Tokenizer
from engine_adapter.token_eviction.generate import append_tokens
from engine_adapter.token_eviction.presses.base import kept_for_ratio
from engine_adapter.token_eviction.registry import make_token_policy
from engine_adapter.token_eviction.sequence_kv import SequenceKV

FILLER = [
    "The grass is green and the sky is blue on a quiet summer afternoon.",
    "Old harbours smell of salt, tar and the diesel of the morning ferries.",
    "A good loaf of bread needs flour, water, salt, yeast and a little patience.",
    "The library keeps its rare maps in a cool room behind a heavy oak door.",
    "Trains leave the northern station every twenty minutes until midnight.",
    "Bees visit thousands of flowers to make a single spoonful of honey.",
    "The committee postponed its decision until the spring meeting.",
    "Mountain paths are marked with red and white stripes painted on rocks.",
    "In the evening the market stalls fold their awnings and the square empties.",
    "Copper turns green when it is left out in the rain for many years.",
    "The violinist tuned her instrument twice before the concert began.",
    "Most of the town's water comes from a reservoir in the eastern hills.",
    "A lighthouse keeper once lived alone on the rock for eleven winters.",
    "Children in the village learn to swim in the river before they can read.",
    "The recipe calls for two onions, three cloves of garlic and fresh thyme.",
    "Satellites pass overhead like slow stars just after the sun has set.",
    "The museum's oldest clock still strikes the hour a minute late.",
    "Farmers rotate their crops so that the soil keeps its strength.",
    "The bridge was repainted last year in the same dull grey as before.",
    "Letters from abroad took three weeks to arrive in those days.",
]
KEYS = ["amber", "falcon", "harbor", "juniper", "lantern", "meadow", "orbit", "quartz", "saffron", "tundra"]
POLICIES = ("sliding", "snapkv", "h2o", "tova")
PRESSES = {"sliding": "StreamingLLMPress", "snapkv": "SnapKVPress", "tova": "TOVAPress"}
MAX_NEW = 12


@dataclass(slots=True)
class Sample:
    context_ids: list[int]
    question_ids: list[int]
    value: str
    depth: float


def make_sample(tokenizer: Tokenizer, template: str, length: int, rng: random.Random) -> Sample:
    """A haystack of about `length` tokens with one needle at a random depth."""
    key, value = rng.choice(KEYS), str(rng.randint(10_000, 9_999_999))
    depth = rng.uniform(0.1, 0.9)
    needle = f"One of the special magic numbers for {key} is: {value}."
    sentences: list[str] = []
    tokens = 0
    while tokens < length - 80:
        sentence = rng.choice(FILLER)
        sentences.append(sentence)
        tokens += len(tokenizer.encode(" " + sentence, add_special_tokens=False))
    sentences.insert(int(len(sentences) * depth), needle)
    question = f"What is the special magic number for {key} mentioned in the provided text?"
    haystack = " ".join(sentences)
    text = render_chat(template, [ChatMessage("user", f"{haystack}\n\n{question}")])
    text += f"The special magic number for {key} mentioned in the provided text is"
    split = text.index("\n\n" + question)
    return Sample(
        context_ids=tokenizer.encode(text[:split], add_special_tokens=False),
        question_ids=tokenizer.encode(text[split:], add_special_tokens=False),
        value=value,
        depth=depth,
    )


# ---- ours ---------------------------------------------------------------------------------------


def _prefill(decoder: Decoder, pool: PagedKVPool, ids: list[int]) -> tuple[SequenceKV, torch.Tensor, float]:
    """One prefill observing what every policy needs (SnapKV's 64 queries, H2O's sums)."""
    table = pool.allocator.allocate(-(-len(ids) // pool.block_size))
    observer = AttentionObserver(window=64, accumulate=True)
    t0 = time.perf_counter()
    out = decoder(ForwardBatch([ids], [0], [table], observers=[observer]), pool)
    return SequenceKV(pool, table, len(ids), observer=observer), out.logits[0], time.perf_counter() - t0


def _greedy(
    decoder: Decoder, pool: PagedKVPool, kv: SequenceKV, logits: torch.Tensor, eos: frozenset[int]
) -> list[int]:
    out: list[int] = []
    while len(out) < MAX_NEW:
        token = int(torch.argmax(logits))
        if token in eos:
            break
        out.append(token)
        logits = append_tokens(decoder, pool, kv, [token])
    return out


def run_ours(
    decoder: Decoder,
    tokenizer: Tokenizer,
    sample: Sample,
    mode: str,
    ratios: list[float],
    cost: dict[str, list[float]],
) -> dict[tuple[str, float], tuple[bool, int, int]]:
    """(policy, ratio) -> (correct, blocks before, blocks after)."""
    ids = sample.context_ids if mode == "agnostic" else sample.context_ids + sample.question_ids
    total = len(sample.context_ids) + len(sample.question_ids) + MAX_NEW + 1
    pool = decoder.make_pool(num_blocks=2 * (-(-total // 16)) + 8, block_size=16)
    base, logits, prefill_s = _prefill(decoder, pool, ids)
    cost["prefill"].append(prefill_s)
    rows: dict[tuple[str, float], tuple[bool, int, int]] = {}
    for policy_name in ("none", *POLICIES):
        for ratio in [0.0] if policy_name == "none" else ratios:
            kv = base.clone()
            blocks_before = kv.num_blocks()
            policy = make_token_policy(policy_name, window=10**6)
            t0 = time.perf_counter()
            if ratio > 0:
                policy.evict(kv, kept_for_ratio(kv.length, ratio))
            cost[policy_name].append(time.perf_counter() - t0)
            blocks_after = kv.num_blocks()
            step_logits = (
                append_tokens(decoder, pool, kv, sample.question_ids) if mode == "agnostic" else logits
            )
            answer = tokenizer.decode(_greedy(decoder, pool, kv, step_logits, tokenizer.eos_token_ids))
            rows[(policy_name, ratio)] = (sample.value in answer, blocks_before, blocks_after)
            pool.allocator.free(kv.block_table)
    pool.allocator.free(base.block_table)
    return rows


# ---- kvpress's presses on transformers -----------------------------------------------------------


def run_kvpress(
    model: Any, sample: Sample, mode: str, ratios: list[float], eos: frozenset[int]
) -> dict[tuple[str, float], bool]:
    import kvpress
    import transformers

    ids = sample.context_ids if mode == "agnostic" else sample.context_ids + sample.question_ids
    inputs: dict[int, tuple[torch.Tensor, Any]] = {}

    def keep_inputs(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        inputs[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"])

    layers = model.model.layers
    hooks = [layer.self_attn.register_forward_hook(keep_inputs, with_kwargs=True) for layer in layers]
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    finally:
        for hook in hooks:
            hook.remove()
    rows: dict[tuple[str, float], bool] = {}
    for name, press_name in PRESSES.items():
        for ratio in ratios:
            press = getattr(kvpress, press_name)(compression_ratio=ratio)
            copy = transformers.DynamicCache(config=model.config)
            with torch.no_grad():
                for i, layer in enumerate(layers):
                    hidden, position = inputs[i]
                    keys, values = cache.layers[i].keys, cache.layers[i].values
                    k, v = press.compress(
                        layer.self_attn, hidden, keys, values, None, {"position_embeddings": position}
                    )
                    copy.update(k, v, i)
                position_ = len(ids)
                logits = out.logits[0, -1]
                if mode == "agnostic":
                    q = sample.question_ids
                    pos = torch.arange(position_, position_ + len(q))
                    step = model(torch.tensor([q]), past_key_values=copy, position_ids=pos[None])
                    logits, position_ = step.logits[0, -1], position_ + len(q)
                answer: list[int] = []
                while len(answer) < MAX_NEW:
                    token = int(torch.argmax(logits))
                    if token in eos:
                        break
                    answer.append(token)
                    pos = torch.tensor([position_])
                    step = model(
                        torch.tensor([[token]]),
                        past_key_values=copy,
                        position_ids=pos[None],
                    )
                    logits, position_ = step.logits[0, -1], position_ + 1
            rows[(name, ratio)] = answer  # type: ignore[assignment]
    return rows


def pressure_demo(tokenizer: Tokenizer, template: str) -> None:
    """The engine on a pool too small for two generations: preempted, or compressed instead."""
    from engine_adapter.model.sampling import SamplingParams
    from engine_adapter.serving.config import EngineConfig
    from engine_adapter.serving.engine import Engine

    rng = random.Random(1)
    prompts = [make_sample(tokenizer, template, 500, rng) for _ in range(2)]
    ids = [p.context_ids + p.question_ids for p in prompts]
    need = sum(len(i) + 200 for i in ids)
    blocks = (need * 3 // 4) // 16
    print(f"\nPressure: 2 x ({[len(i) for i in ids]} prompt + 200) tokens on {blocks} blocks of 16")
    for policy in ("none", *POLICIES):
        engine = Engine(
            EngineConfig(
                model="smollm2-135m", device="cpu", num_blocks=blocks, block_size=16,
                token_eviction=policy, memory_threshold=0, socket="/tmp/sage-bench-unused.sock",
            )
        )  # fmt: skip
        engine.start()
        t0 = time.perf_counter()
        try:
            handles = [engine.submit(i, SamplingParams(max_tokens=200, ignore_eos=True)) for i in ids]
            results = [h.result(3600) for h in handles]
            token = engine.token_eviction()
            freed = token["bytes_freed_total"] / 2**20
            print(
                f"  {policy:8s} finished {[r.finish_reason for r in results]}, "
                f"{[r.completion_tokens for r in results]} tokens, "
                f"preemptions {engine.eviction_stats().preemptions}, compressions {token['compressions']} "
                f"({token['tokens_evicted_total']} tokens, {freed:.1f} MiB freed), "
                f"{time.perf_counter() - t0:.0f}s",
                flush=True,
            )
        finally:
            engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="1024,2048", help="context lengths in tokens (about)")
    parser.add_argument("--ratios", default="0.25,0.5,0.75,0.9")
    parser.add_argument("--samples", type=int, default=3, help="samples per length")
    parser.add_argument("--modes", default="agnostic,aware")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kvpress", action="store_true", help="also kvpress's presses (reference rows)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pressure", action="store_true", help="only the engine-under-pressure part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
    modes = args.modes.split(",")
    decoder, tokenizer, _cfg = load_model("smollm2-135m", device="cpu")
    template = tokenizer.chat_template
    assert template is not None
    reference = None
    if args.kvpress:
        import transformers

        from engine_adapter.model.builtin import smollm2_gguf_path

        path = smollm2_gguf_path()
        assert path is not None
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
    print(machine_line(), flush=True)
    if args.pressure:
        pressure_demo(tokenizer, template)
        return
    correct: dict[tuple[int, str, str, str, float], int] = defaultdict(int)
    blocks: dict[tuple[int, float], tuple[int, int]] = {}
    cost: dict[int, dict[str, list[float]]] = {n: defaultdict(list) for n in lengths}
    real_len: dict[int, list[int]] = defaultdict(list)
    rng = random.Random(args.seed)
    t_start = time.time()
    for length in lengths:
        for _ in range(args.samples):
            sample = make_sample(tokenizer, template, length, rng)
            real_len[length].append(len(sample.context_ids) + len(sample.question_ids))
            for mode in modes:
                ours = run_ours(decoder, tokenizer, sample, mode, ratios, cost[length])
                for (policy, ratio), (ok, before, after) in ours.items():
                    correct[(length, mode, "sage", policy, ratio)] += ok
                    if mode == "agnostic" and policy == "snapkv":
                        blocks[(length, ratio)] = (before, after)
                if reference is not None:
                    ref = run_kvpress(reference, sample, mode, ratios, tokenizer.eos_token_ids)
                    for (policy, ratio), answer in ref.items():
                        ok = sample.value in tokenizer.decode(answer)  # type: ignore[arg-type]
                        correct[(length, mode, "kvpress", policy, ratio)] += ok
            print(f"  length {length}: sample done ({time.time() - t_start:.0f}s)", flush=True)
    report: dict[str, Any] = {"samples": args.samples, "rows": []}
    print(f"\nNeedle accuracy (correct of {args.samples} per cell; seed {args.seed})")
    header = "| length | mode | impl | policy | " + " | ".join(f"{r:g}" for r in ratios) + " |"
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for length in lengths:
        mean_len = sum(real_len[length]) // max(1, len(real_len[length]))
        for mode in modes:
            base = correct[(length, mode, "sage", "none", 0.0)]
            print(f"| {mean_len} | {mode} | sage | none (uncompressed) | {base} |" + " |" * (len(ratios) - 1))
            for impl in ("sage", "kvpress") if reference is not None else ("sage",):
                for policy in POLICIES:
                    if impl == "kvpress" and policy not in PRESSES:
                        continue
                    cells = [correct[(length, mode, impl, policy, r)] for r in ratios]
                    name = PRESSES[policy] if impl == "kvpress" else policy
                    print(f"| {mean_len} | {mode} | {impl} | {name} | " + " | ".join(map(str, cells)) + " |")
                    row = {"length": mean_len, "mode": mode, "impl": impl, "policy": policy}
                    row["correct"] = dict(zip(map(str, ratios), cells, strict=True))
                    report["rows"].append(row)
    print("\nMemory: blocks of 16 tokens of the compressed sequence (from the pool), query-agnostic context")
    for (length, ratio), (before, after) in sorted(blocks.items()):
        print(f"  ~{length} tokens, ratio {ratio:g}: {before} -> {after} blocks ({after / before:.3f})")
    print("\nCost: compression time / prefill time (median over samples and modes)")
    for length in lengths:
        prefill = sorted(cost[length]["prefill"])[len(cost[length]["prefill"]) // 2]
        parts = []
        for policy in POLICIES:
            times = sorted(cost[length][policy])
            parts.append(f"{policy} {times[len(times) // 2] / prefill * 100:.2f} %")
        print(f"  ~{length} tokens: prefill {prefill:.1f}s; " + ", ".join(parts))
        report.setdefault("cost", {})[length] = {"prefill_s": prefill}
    print(f"\nwall time {time.time() - t_start:.0f}s")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
