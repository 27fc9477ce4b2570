"""Quality and speed of each dtype and weight quantization of SmolLM2, measured against float32.

- Agreement: 200 seeded prompts (short questions and code snippets in the model's chat template).
  float32 prefills each and decodes `--steps` greedy tokens; every other setting is fed the same
  tokens (teacher forcing: a prefill, then one decode step per token, through the paged pool)
  and scores, at each of the 1 + steps positions, whether its top-1 token is float32's.
- Needle: the needle-in-a-haystack samples of benchmarks/token_quality.py (`make_sample`, no
  eviction): the share whose greedy answer holds the magic number.
- Speed: decode tokens/s at batch 1 and 8 after a prefill of `--context` random tokens
  (benchmarks/decode_profile.py's loop), median step.

    python benchmarks/precision_quality.py                          # fp32, bf16, fp16, int8, int4
    python benchmarks/precision_quality.py --settings float32,int8 --prompts 50 --needles 2
    python benchmarks/precision_quality.py --settings float32,int8,int4 --speed-rounds 3  # speed only
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line
from decode_profile import decode_steps, prefilled
from token_quality import MAX_NEW, make_sample

from engine_adapter.model.chat_template import ChatMessage, render_chat
from engine_adapter.model.decoder import Decoder, ForwardBatch
from engine_adapter.model.loader import load_model
from engine_adapter.model.tokenizer import Tokenizer

# name -> (dtype, quantization)
SETTINGS = {
    "float32": ("float32", "none"),
    "bfloat16": ("bfloat16", "none"),
    "float16": ("float16", "none"),
    "int8": ("float32", "int8"),
    "int4": ("float32", "int4"),
    "int8-bf16": ("bfloat16", "int8"),
    "int4-bf16": ("bfloat16", "int4"),
}
TOPICS = ["the moon", "volcanoes", "bread", "rivers", "chess", "bees", "glass", "trains", "music", "salt"]
WORDS = ["apple", "window", "river", "garden", "silver", "planet", "candle", "forest", "mirror", "ladder"]


def prompts(tokenizer: Tokenizer, count: int, seed: int) -> list[list[int]]:
    """`count` chat prompts from a fixed seed: questions, arithmetic, words and code snippets."""
    rng = random.Random(seed)
    template = tokenizer.chat_template
    assert template is not None
    kinds = [
        lambda: f"Tell me one fact about {rng.choice(TOPICS)}.",
        lambda: f"What is {rng.randint(2, 99)} plus {rng.randint(2, 99)}?",
        lambda: f"Give a word that rhymes with {rng.choice(WORDS)}.",
        lambda: f"Write a short sentence using the words {rng.choice(WORDS)} and {rng.choice(WORDS)}.",
        lambda: (
            f"def f(x):\n    return x * {rng.randint(2, 9)} + {rng.randint(0, 9)}\n\n"
            f"What is f({rng.randint(1, 9)})?"
        ),
        lambda: f"Explain in one line why {rng.choice(TOPICS)} matter to people.",
        lambda: f"for i in range({rng.randint(2, 6)}):\n    print(i * i)\n\nWhat does this print?",
    ]
    out = []
    for _ in range(count):
        text = render_chat(template, [ChatMessage("user", rng.choice(kinds)())])
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def top1_per_position(
    decoder: Decoder, batch: list[list[int]], forced: list[list[int]] | None, steps: int
) -> list[list[int]]:
    """Per prompt, the top-1 token after the prompt and after each of `steps` further tokens:
    greedy when `forced` is None, else fed `forced`'s tokens."""
    pool = decoder.make_pool(num_blocks=len(batch) * 16, block_size=16)
    tables = [pool.allocator.allocate(-(-(len(p) + steps + 1) // 16)) for p in batch]
    logits = decoder(ForwardBatch(batch, [0] * len(batch), tables), pool).logits
    tops = [[t] for t in logits.argmax(-1).tolist()]
    positions = [len(p) for p in batch]
    for step in range(steps):
        feed = [row[step] for row in (forced if forced is not None else tops)]
        logits = decoder(ForwardBatch([[t] for t in feed], positions, tables), pool).logits
        for row, token in zip(tops, logits.argmax(-1).tolist(), strict=True):
            row.append(token)
        positions = [p + 1 for p in positions]
    return tops


def needle_score(decoder: Decoder, tokenizer: Tokenizer, count: int, length: int, seed: int) -> float:
    """Share of `count` needle samples (token_quality's) whose 12-token greedy answer holds the value."""
    template = tokenizer.chat_template
    assert template is not None
    rng = random.Random(seed)
    hits = 0
    for _ in range(count):
        sample = make_sample(tokenizer, template, length, rng)
        ids = sample.context_ids + sample.question_ids
        pool = decoder.make_pool(num_blocks=-(-(len(ids) + MAX_NEW) // 16), block_size=16)
        table = pool.allocator.allocate(pool.num_blocks)
        logits = decoder(ForwardBatch([ids], [0], [table]), pool).logits[0]
        answer: list[int] = []
        while len(answer) < MAX_NEW:
            answer.append(int(logits.argmax()))
            logits = decoder(
                ForwardBatch([[answer[-1]]], [len(ids) + len(answer) - 1], [table]), pool
            ).logits[0]
        hits += sample.value in tokenizer.decode(answer)
    return hits / count


@dataclass(slots=True)
class Row:
    setting: str
    agreement: float
    needle: float
    tokens_per_s: dict[int, float]


def decode_rate(decoder: Decoder, batch: int, context: int, steps: int) -> float:
    pool, tables, tokens = prefilled(decoder, batch, context)
    decode_steps(decoder, pool, tables, tokens, context, 3)  # warm-up
    return batch / statistics.median(decode_steps(decoder, pool, tables, tokens, context + 3, steps))


def interleaved_speed(settings: list[str], context: int, steps: int, rounds: int) -> None:
    """Decode tokens/s of every setting, `rounds` rounds taking turns in one process (a change of
    the machine's load then hits every setting alike); the median round and the ratio to the first."""
    models = {}
    for name in settings:
        dtype, quantization = SETTINGS[name]
        models[name] = load_model("smollm2-135m", device="cpu", dtype=dtype, quantization=quantization)[0]
    rates: dict[tuple[str, int], list[float]] = {(n, b): [] for n in models for b in (1, 8)}
    for _ in range(rounds):
        for name, decoder in models.items():
            for b in (1, 8):
                rates[(name, b)].append(decode_rate(decoder, b, context, steps))
    first = settings[0]
    print(f"\n{rounds} interleaved rounds, median; decode at context {context}\n")
    print(f"| setting | tok/s b=1 | vs {first} | tok/s b=8 | vs {first} |")
    print("|---|---|---|---|---|")
    for name in models:
        cells = []
        for b in (1, 8):
            rate = statistics.median(rates[(name, b)])
            cells += [f"{rate:.1f}", f"{rate / statistics.median(rates[(first, b)]):.2f}x"]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", default="float32,int4,int8,bfloat16,float16")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--steps", type=int, default=4, help="greedy decode steps after each prefill")
    parser.add_argument("--needles", type=int, default=5)
    parser.add_argument("--needle-length", type=int, default=1024)
    parser.add_argument("--context", type=int, default=128, help="context of the speed runs")
    parser.add_argument("--speed-steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed-rounds", type=int, default=0, help="only speed: interleaved rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {machine_line()}; torch threads {torch.get_num_threads()}", flush=True)
    if args.speed_rounds:
        interleaved_speed(args.settings.split(","), args.context, args.speed_steps, args.speed_rounds)
        return
    _, tokenizer, _ = load_model("smollm2-135m", device="cpu")
    batch = prompts(tokenizer, args.prompts, args.seed)
    reference: list[list[int]] | None = None
    rows: list[Row] = []
    for name in args.settings.split(","):
        dtype, quantization = SETTINGS[name]
        decoder, _, _ = load_model("smollm2-135m", device="cpu", dtype=dtype, quantization=quantization)
        t0 = time.perf_counter()
        tops: list[list[int]] = []
        for lo in range(0, len(batch), 25):
            forced = None if reference is None else reference[lo : lo + 25]
            tops += top1_per_position(decoder, batch[lo : lo + 25], forced, args.steps)
        if reference is None:
            if name != "float32":
                raise SystemExit("the first setting must be float32: the others are scored against it")
            reference = tops
        same = sum(a == b for r, t in zip(reference, tops, strict=True) for a, b in zip(r, t, strict=True))
        agreement = same / sum(len(r) for r in reference)
        needle = needle_score(decoder, tokenizer, args.needles, args.needle_length, args.seed)
        rates = {b: decode_rate(decoder, b, args.context, args.speed_steps) for b in (1, 8)}
        rows.append(Row(name, agreement, needle, rates))
        print(
            f"# {name}: {agreement:.1%} agreement, needle {needle:.0%}, tok/s {rates[1]:.1f} (b=1) "
            f"{rates[8]:.1f} (b=8); {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    print(
        f"\n{args.prompts} prompts x {1 + args.steps} positions; needle: {args.needles} samples of "
        f"~{args.needle_length} tokens; decode at context {args.context}\n"
    )
    print("| setting | top-1 agreement with fp32 | needle | decode tok/s b=1 | decode tok/s b=8 |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.setting} | {row.agreement:.1%} | {row.needle:.0%} | "
            f"{row.tokens_per_s[1]:.1f} | {row.tokens_per_s[8]:.1f} |"
        )


if __name__ == "__main__":
    main()
