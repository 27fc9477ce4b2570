"""Token-level eviction on the real model: needle-in-a-haystack accuracy, memory and cost.

RULER-style tasks, seeded: varied digit-free filler sentences and a needle "One of the special
magic numbers for KEY is: VALUE." (a 5-7 digit value) at a depth of 10-90 %; `multikey` adds
3-4 other key-number lines of the same form spread through the filler (RULER's
niah_multikey). The question comes after the context, in SmolLM2-135M-Instruct's chat template,
the answer primed with "The special magic number for KEY mentioned in the provided text is".
A row is correct when its greedy answer (12 tokens) contains the value.

Query-agnostic, as kvpress's pipeline: the context is compressed, then the question is
prefilled on top. One prefill per sample serves every (policy, ratio) row: each row compresses
a copy of the prefilled cache (`SequenceKV.clone`). Every policy is a spec
(``--policies``, e.g. ``knorm,adakv:snapkv,pyramid:snapkv``).

Reference rows (``--kvpress``, needs the ``kvpress`` and ``hf`` extras): kvpress's press of the
same name beside each sage press in the same run. transformers runs the same context ids once
per sample, the inputs of every attention layer are kept, and each press's own ``compress`` is
applied to a copy of each layer's cache, which is what its forward hook does during prefill
(compression after a layer's attention does not change what later layers see); the sketches
of leverage and compactor are drawn after ``torch.manual_seed(0)``, what sage's seed 0 draws.
Then the question and greedy decoding continue at the original positions (AdaKV's masks on the
attention modules). kvpress's H2O (ObservedAttentionPress) needs eager attention's full T x T
weights and has no reference row; nor do sage's wrappers over presses kvpress does not pair.

Per cell also: the compression time as a share of the prefill's, and the K/V bytes the sequence
held at the end (sage: its blocks in the pool; kvpress: its cache tensors, which AdaKV's masks
never shrink).

    python benchmarks/token_quality.py --lengths 1024 --samples 4 --ratios 0.5,0.75,0.9 --kvpress
    python benchmarks/token_quality.py --tasks multikey --policies knorm,compactor --samples 8
    python benchmarks/token_quality.py --pressure       # only the engine under memory pressure

The issue's whole grid (both tasks, ~1k and ~2k, ratios 0.5-0.95, every press and kvpress's)
is hours on a 2-core CPU. Each (task, length) cell draws its samples from its own seeded
generator, so a cell runs alone and a long cell runs in pieces: ``--first-sample N`` skips its
first N samples, and ``--jsonl FILE`` appends every sample's rows as it ends (a run cut short
keeps what it finished)::

    python benchmarks/token_quality.py --tasks multikey --lengths 1024 --ratios 0.5,0.75 \
        --policies leverage,skim,kvzip --samples 8 --first-sample 8 --jsonl multikey.jsonl

kvpress's KVzip has no per-layer ``compress``: its reference row runs its own prefill inside
the press and times the replay alone; its tokenizer is sage's (`HFTokenizer.save_folder`).

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
from engine_adapter.token_eviction.registry import token_policy_from_spec
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
POLICIES = (
    "sliding,snapkv,tova,knorm,keydiff,leverage,compactor,expected_attention,"
    "adakv:snapkv,adakv:expected_attention,pyramid:snapkv,kvzip,skim"
)
PRESS_CLASSES = {
    "sliding": "StreamingLLMPress",
    "snapkv": "SnapKVPress",
    "tova": "TOVAPress",
    "knorm": "KnormPress",
    "keydiff": "KeyDiffPress",
    "leverage": "LeverageScorePress",
    "compactor": "CompactorPress",
    "expected_attention": "ExpectedAttentionPress",
    "kvzip": "KVzipPress",
}
MAX_NEW = 12


@dataclass(slots=True)
class Sample:
    context_ids: list[int]
    question_ids: list[int]
    value: str
    depth: float


def _needle(key: str, value: str) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def make_sample(tokenizer: Tokenizer, template: str, length: int, rng: random.Random, task: str) -> Sample:
    """A haystack of about `length` tokens with one needle at a random depth; `multikey`: and
    3-4 other key-number lines of the same form spread through it (RULER's niah_multikey)."""
    keys = rng.sample(KEYS, 5)
    key, value = keys[0], str(rng.randint(10_000, 9_999_999))
    depth = rng.uniform(0.1, 0.9)
    sentences: list[str] = []
    tokens = 0
    while tokens < length - 80:
        sentence = rng.choice(FILLER)
        sentences.append(sentence)
        tokens += len(tokenizer.encode(" " + sentence, add_special_tokens=False))
    if task == "multikey":
        for other in keys[1 : 1 + rng.choice((3, 4))]:
            at = int(len(sentences) * rng.uniform(0.05, 0.95))
            sentences.insert(at, _needle(other, str(rng.randint(10_000, 9_999_999))))
    sentences.insert(int(len(sentences) * depth), _needle(key, value))
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


@dataclass(slots=True)
class Row:
    """One (policy, ratio) run of one sample: answer, compress time and KV bytes held."""

    correct: bool
    compress_s: float
    kv_bytes: int  # the most the sequence's K/V held after compression (question and answer in)


# ---- ours ---------------------------------------------------------------------------------------


def _prefill(
    decoder: Decoder, pool: PagedKVPool, ids: list[int], accumulate: bool
) -> tuple[SequenceKV, torch.Tensor, float]:
    """One prefill observing what every policy needs: every query (compactor and expected
    attention; SnapKV's 64 and TOVA's 1 are among them), the keys' positions (pre-RoPE presses)
    and, when H2O runs, the attention sums."""
    table = pool.allocator.allocate(-(-len(ids) // pool.block_size))
    observer = AttentionObserver(
        window=1 << 30, accumulate=accumulate, track_positions=True, track_tokens=True
    )
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
    decoder: Decoder, tokenizer: Tokenizer, sample: Sample, policies: list[str], ratios: list[float]
) -> tuple[dict[tuple[str, float], Row], float]:
    """Query-agnostic: (policy, ratio) -> Row, and the prefill time. One prefill serves every
    row: each compresses a copy of the prefilled context (`SequenceKV.clone`)."""
    ids = sample.context_ids
    total = len(ids) + len(sample.question_ids) + MAX_NEW + 1
    # The prefilled context, one compressed copy, and a replay as long as the context (kvzip).
    pool = decoder.make_pool(num_blocks=3 * (-(-total // 16)) + 16, block_size=16)
    base, _logits, prefill_s = _prefill(decoder, pool, ids, accumulate="h2o" in policies)
    rows: dict[tuple[str, float], Row] = {}
    for spec in ("none", *policies):
        for ratio in [0.0] if spec == "none" else ratios:
            kv = base.clone()
            policy = token_policy_from_spec(spec, window=10**6)
            t0 = time.perf_counter()
            if ratio > 0:
                policy.evict(kv, kept_for_ratio(kv.length, ratio), ratio=ratio)
            compress_s = time.perf_counter() - t0
            logits = append_tokens(decoder, pool, kv, sample.question_ids)
            answer = tokenizer.decode(_greedy(decoder, pool, kv, logits, tokenizer.eos_token_ids))
            kv_bytes = kv.num_blocks() * pool.bytes_per_block
            rows[(spec, ratio)] = Row(sample.value in answer, compress_s, kv_bytes)
            pool.allocator.free(kv.block_table)
    pool.allocator.free(base.block_table)
    return rows, prefill_s


# ---- kvpress's presses on transformers -----------------------------------------------------------


def kvpress_press(spec: str, ratio: float) -> Any | None:
    """kvpress's press of the same name (and defaults) as a sage spec, or None where it has
    none (h2o needs eager attention's T x T weights; sage's wrappers over other presses)."""
    import kvpress

    name, _, inner = spec.partition(":")
    if name == "pyramid":
        return kvpress.PyramidKVPress(compression_ratio=ratio) if inner in ("", "snapkv") else None
    if name == "adakv":
        press = kvpress_press(inner or "snapkv", ratio)
        return None if press is None else kvpress.AdaKVPress(press)
    cls = PRESS_CLASSES.get(name)
    return None if cls is None or inner else getattr(kvpress, cls)(compression_ratio=ratio)


def _kvpress_compress(model: Any, press: Any, cache: Any, inputs: dict[int, Any]) -> Any:
    """A compressed copy of `cache`: each layer's press.compress on that layer's prefill inputs,
    which is what its forward hook does during prefill (a layer's compression does not change
    what later layers see). AdaKV leaves its masks on the attention modules."""
    import transformers

    copy = transformers.DynamicCache(config=model.config)
    torch.manual_seed(0)  # the sketches of leverage and compactor: sage's seed 0 draws the same
    for i, layer in enumerate(model.model.layers):
        hidden, position = inputs[i]
        layer.self_attn.rotary_emb = model.model.rotary_emb  # as BasePress.__call__ sets it
        keys, values = cache.layers[i].keys, cache.layers[i].values
        k, v = press.compress(layer.self_attn, hidden, keys, values, None, {"position_embeddings": position})
        copy.update(k, v, i)
    return copy


def _kvpress_kvzip(model: Any, press: Any, ids: list[int]) -> tuple[Any, float]:
    """KVzip runs its replay through the model after a prefill inside its context manager (no
    per-layer ``compress``): a prefill of its own, the replay timed alone. It leaves masks on the
    attention modules and the cache whole."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    replay = press._perform_kvzip_compression
    timing: list[float] = []

    def timed(*args: Any) -> None:
        t0 = time.perf_counter()
        replay(*args)
        timing.append(time.perf_counter() - t0)

    press._perform_kvzip_compression = timed
    with press(model):
        model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache, sum(timing)


def run_kvpress(
    model: Any, sample: Sample, policies: list[str], ratios: list[float], tokenizer: Tokenizer
) -> dict[tuple[str, float], Row]:
    """Query-agnostic: the context prefilled once, compressed per (press, ratio), then the
    question and greedy decoding at the original positions."""
    import transformers

    ids = sample.context_ids
    inputs: dict[int, tuple[torch.Tensor, Any]] = {}

    def keep_inputs(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        inputs[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"])

    layers = model.model.layers
    hooks = [layer.self_attn.register_forward_hook(keep_inputs, with_kwargs=True) for layer in layers]
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    finally:
        for hook in hooks:
            hook.remove()
    rows: dict[tuple[str, float], Row] = {}
    for spec in policies:
        for ratio in ratios:
            press = kvpress_press(spec, ratio)
            if press is None:
                continue
            with torch.no_grad():
                if type(press).__name__ == "KVzipPress":
                    copy, compress_s = _kvpress_kvzip(model, press, ids)
                else:
                    t0 = time.perf_counter()
                    copy = _kvpress_compress(model, press, cache, inputs)
                    compress_s = time.perf_counter() - t0
                stepwise = type(press).__name__ == "PyramidKVPress"
                answer = _kvpress_answer(
                    model, copy, sample, len(ids), tokenizer.eos_token_ids, stepwise=stepwise
                )
            kv_bytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in copy.layers)
            rows[(spec, ratio)] = Row(sample.value in tokenizer.decode(answer), compress_s, kv_bytes)
            for layer in layers:
                layer.self_attn.masked_key_indices = None
    return rows


def _kvpress_answer(
    model: Any, cache: Any, sample: Sample, position: int, eos: frozenset[int], *, stepwise: bool
) -> list[int]:
    """The question on top of the compressed cache, then greedy decoding. `stepwise`: the
    question one token at a time (PyramidKV's layers hold different lengths, and transformers
    sizes a multi-token step's causal mask by one layer's)."""
    q = sample.question_ids
    chunks = [[t] for t in q] if stepwise else [q]
    for chunk in chunks:
        pos = torch.arange(position, position + len(chunk))[None]
        step = model(torch.tensor([chunk]), past_key_values=cache, position_ids=pos)
        position += len(chunk)
    logits = step.logits[0, -1]
    answer: list[int] = []
    while len(answer) < MAX_NEW:
        token = int(torch.argmax(logits))
        if token in eos:
            break
        answer.append(token)
        step = model(torch.tensor([[token]]), past_key_values=cache, position_ids=torch.tensor([[position]]))
        logits, position = step.logits[0, -1], position + 1
    return answer


def pressure_demo(tokenizer: Tokenizer, template: str, policies: list[str]) -> None:
    """The engine on a pool too small for two generations: preempted, or compressed instead."""
    from engine_adapter.model.sampling import SamplingParams
    from engine_adapter.serving.config import EngineConfig
    from engine_adapter.serving.engine import Engine

    rng = random.Random(1)
    prompts = [make_sample(tokenizer, template, 500, rng, "single") for _ in range(2)]
    ids = [p.context_ids + p.question_ids for p in prompts]
    need = sum(len(i) + 200 for i in ids)
    blocks = (need * 3 // 4) // 16
    print(f"\nPressure: 2 x ({[len(i) for i in ids]} prompt + 200) tokens on {blocks} blocks of 16")
    for policy in ("none", *policies):
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
                f"  {policy:20s} finished {[r.finish_reason for r in results]}, "
                f"{[r.completion_tokens for r in results]} tokens, "
                f"preemptions {engine.eviction_stats().preemptions}, compressions {token['compressions']} "
                f"({token['tokens_evicted_total']} tokens, {freed:.1f} MiB freed), "
                f"{time.perf_counter() - t0:.0f}s",
                flush=True,
            )
        finally:
            engine.shutdown()


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="1024,2048", help="context lengths in tokens (about)")
    parser.add_argument("--ratios", default="0.5,0.75,0.9,0.95")
    parser.add_argument("--samples", type=int, default=3, help="samples per task and length")
    parser.add_argument("--tasks", default="single,multikey", help="single (one needle), multikey")
    parser.add_argument("--policies", default=POLICIES, help="sage policy specs, comma-separated; ';' also")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kvpress", action="store_true", help="also kvpress's presses of the same names")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--first-sample", type=int, default=0,
        help="skip this many samples of each (task, length) cell: run a long grid in pieces",
    )  # fmt: skip
    parser.add_argument("--jsonl", type=Path, help="append every sample's rows to this file as it ends")
    parser.add_argument("--pressure", action="store_true", help="only the engine-under-pressure part")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
    tasks = args.tasks.split(",")
    policies = _split_specs(args.policies)
    for spec in policies:
        token_policy_from_spec(spec)  # a bad spec fails now, not after the first prefill
    decoder, tokenizer, _cfg = load_model("smollm2-135m", device="cpu")
    template = tokenizer.chat_template
    assert template is not None
    reference = _reference(tokenizer) if args.kvpress else None
    print(machine_line(), flush=True)
    if args.pressure:
        pressure_demo(tokenizer, template, policies)
        return
    rows: dict[tuple[str, int, str, str, float], list[Row]] = defaultdict(list)
    prefill: dict[tuple[str, int], list[float]] = defaultdict(list)
    real_len: dict[int, list[int]] = defaultdict(list)
    t_start = time.time()
    for task in tasks:
        for length in lengths:
            # One generator per cell: a cell's samples are the same whichever cells run with it.
            rng = random.Random(f"{args.seed}:{task}:{length}")
            for index in range(args.first_sample + args.samples):
                sample = make_sample(tokenizer, template, length, rng, task)
                if index < args.first_sample:
                    continue
                real_len[length].append(len(sample.context_ids) + len(sample.question_ids))
                ours, prefill_s = run_ours(decoder, tokenizer, sample, policies, ratios)
                prefill[(task, length)].append(prefill_s)
                for (spec, ratio), row in ours.items():
                    rows[(task, length, "sage", spec, ratio)].append(row)
                theirs = {}
                if reference is not None:
                    theirs = run_kvpress(reference, sample, policies, ratios, tokenizer)
                for (spec, ratio), row in theirs.items():
                    rows[(task, length, "kvpress", spec, ratio)].append(row)
                cell = {"task": task, "length": length, "sample": index, "prefill_s": prefill_s}
                _log_sample(args.jsonl, cell, {"sage": ours, "kvpress": theirs})
                print(f"  {task} ~{length}: sample {index} done ({time.time() - t_start:.0f}s)", flush=True)
    report = _print_tables(rows, prefill, real_len, tasks, lengths, policies, ratios, args.samples)
    print(f"\nwall time {time.time() - t_start:.0f}s")
    if args.json:
        print(json.dumps(report))


def _log_sample(
    path: Path | None, cell: dict[str, Any], rows: dict[str, dict[tuple[str, float], Row]]
) -> None:
    """One sample's rows as JSON lines (appended, flushed: a run cut short keeps its samples)."""
    if path is None:
        return
    with path.open("a", encoding="utf-8") as out:
        for impl, by_row in rows.items():
            for (spec, ratio), row in by_row.items():
                line = {**cell, "impl": impl, "policy": spec, "ratio": ratio, "correct": row.correct,
                        "compress_s": row.compress_s, "kv_bytes": row.kv_bytes}  # fmt: skip
                out.write(json.dumps(line) + "\n")


def _split_specs(text: str) -> list[str]:
    """Specs separated by commas, where a comma followed by ``k=v`` belongs to the spec before
    (``adakv:snapkv,alpha_safeguard=0.1,knorm`` is two specs); ';' always separates."""
    specs: list[str] = []
    for part in (p.strip() for chunk in text.split(";") for p in chunk.split(",")):
        if not part:
            continue
        if "=" in part and specs and ":" in specs[-1]:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _reference(tokenizer: Tokenizer) -> Any:
    """transformers' SmolLM2 from the same GGUF; its config path points at sage's tokenizer
    written as a Hugging Face folder, which KVzip reads (transformers' conversion of the GGUF's
    tokenizer garbles the newlines of KVzip's replay prompt)."""
    import tempfile

    import transformers

    from engine_adapter.model.builtin import smollm2_gguf_path

    path = smollm2_gguf_path()
    assert path is not None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    save_folder = getattr(tokenizer, "save_folder", None)
    if save_folder is not None:
        model.config.name_or_path = str(save_folder(Path(tempfile.mkdtemp(prefix="sage-tok-"))))
    return model


def _print_tables(
    rows: dict[tuple[str, int, str, str, float], list[Row]],
    prefill: dict[tuple[str, int], list[float]],
    real_len: dict[int, list[int]],
    tasks: list[str],
    lengths: list[int],
    policies: list[str],
    ratios: list[float],
    samples: int,
) -> dict[str, Any]:
    report: dict[str, Any] = {"samples": samples, "rows": []}
    print(f"\nQuery-agnostic needle accuracy (correct of {samples} per cell), compress time (median, "
          "% of the prefill) and K/V MiB the sequence held at the end (median), per ratio")  # fmt: skip
    header = "| task | length | impl | policy | " + " | ".join(f"{r:g}" for r in ratios)
    header += " | compress % | KV MiB |"
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for task in tasks:
        for length in lengths:
            mean_len = sum(real_len[length]) // max(1, len(real_len[length]))
            pre = _median(prefill[(task, length)])
            base = rows[(task, length, "sage", "none", 0.0)]
            mib = _median([r.kv_bytes / 2**20 for r in base])
            print(f"| {task} | {mean_len} | sage | none (uncompressed) | {sum(r.correct for r in base)}"
                  + " |" * len(ratios) + f" prefill {pre:.2f} s | {mib:.1f} |")  # fmt: skip
            for spec in policies:
                for impl in ("sage", "kvpress"):
                    cells = [rows.get((task, length, impl, spec, r), []) for r in ratios]
                    if not any(cells):
                        continue
                    correct = [str(sum(r.correct for r in c)) if c else "-" for c in cells]
                    pct = "/".join(
                        f"{_median([r.compress_s for r in c]) / pre * 100:.1f}" for c in cells if c
                    )
                    kv = "/".join(f"{_median([r.kv_bytes / 2**20 for r in c]):.1f}" for c in cells if c)
                    print(
                        f"| {task} | {mean_len} | {impl} | {spec} | "
                        + " | ".join(correct)
                        + f" | {pct} | {kv} |"
                    )
                    report["rows"].append(
                        {"task": task, "length": mean_len, "impl": impl, "policy": spec,
                         "correct": dict(zip(map(str, ratios), correct, strict=True)),
                         "compress_pct_of_prefill": pct, "kv_mib": kv}
                    )  # fmt: skip
    return report


if __name__ == "__main__":
    main()
