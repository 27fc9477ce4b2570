"""The colocation workload: LLM requests and embedding batches on one pool, and their capacity.

The grid of spec 004 (section 5.2.1): LLM:embedding ratios (by request count) 1:9 to 9:1,
Poisson, bursty and periodic arrivals, LLM outputs short (50-100 tokens), medium (200-500) or
long (1000-2000), embedding batches of 16, 32, 64 or 128 texts; plus the shifting mix (issue 19):
the ratio steps from 9:1 to 1:9 and back in thirds of the run.

Load is a fraction of the capacity of the mix (`capacity`): the request rate at which the
engine's compute is fully busy (shared compute: one engine does both; split: the busier of the
two devices) or the LLM's KV demand fills the pool, whichever comes first, estimated from the
cost models (`engine_adapter.sim.cost_model.CostModel` for LLM steps, `EmbeddingCostModel` for
embedding batches).

Seeded: the same arguments give the same requests. Pure Python and numpy; imports the cost
model (`engine_adapter.sim.cost_model`) only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine_adapter.sim.cost_model import CostModel, CostModelError

__all__ = [
    "ARRIVAL_PATTERNS",
    "COMPUTE_MODES",
    "OUTPUT_CLASSES",
    "RATIOS",
    "SHIFT",
    "ColocationWorkload",
    "EmbeddingCostModel",
    "EmbeddingRequest",
    "LLMRequest",
    "PoolShape",
    "capacity",
    "generate",
    "parse_ratio",
]

RATIOS = ("1:9", "3:7", "5:5", "7:3", "9:1")
SHIFT = "shift"
ARRIVAL_PATTERNS = ("poisson", "bursty", "periodic")
OUTPUT_CLASSES = {"short": (50, 100), "medium": (200, 500), "long": (1000, 2000)}
COMPUTE_MODES = ("shared", "split")
BATCH_TEXTS = (16, 32, 64, 128)
_SHIFT_PHASES = (0.9, 0.1, 0.9)  # LLM fraction in each third of a shifting run


def parse_ratio(text: str) -> float | None:
    """The LLM fraction of ``"L:E"`` (e.g. ``"7:3"`` -> 0.7); None for ``"shift"``.

    Raises:
        ValueError: Not ``L:E`` with positive integers, or ``shift``.
    """
    if text == SHIFT:
        return None
    left, sep, right = text.partition(":")
    if sep and left.isdigit() and right.isdigit() and int(left) > 0 and int(right) > 0:
        return int(left) / (int(left) + int(right))
    raise ValueError(f"ratio must be L:E with positive integers (e.g. 7:3) or 'shift', got {text!r}")


@dataclass(frozen=True, slots=True)
class EmbeddingCostModel:
    """Time and workspace of an embedding batch (a forward pass without KV, then pooling).

    Time, in the style of `CostModel.prefill_time`: ``base_s + per_token_s * tokens +
    attn_s * sum(len_i ** 2) / 2``. The defaults are the served model's prefill costs (sage's
    engine embeds with it, issue 19). Workspace, as the spec's ``batch_size * max_seq_len *
    d_model`` times the bytes and the live intermediates per token: ``texts * max_len *
    workspace_bytes_per_token``, in pool blocks of `block_bytes`.
    """

    base_s: float = 0.005
    per_token_s: float = 8.0e-5
    attn_s: float = 3.5e-9
    workspace_bytes_per_token: int = 131072  # d_model 4096 * fp16 * 16 live activations
    block_bytes: int = 16 * 524288  # 16 tokens of 7B fp16 KV (0.5 MiB per token)

    def __post_init__(self) -> None:
        for name in ("base_s", "per_token_s", "attn_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise CostModelError(f"{name} must be a finite number >= 0 (seconds), got {value!r}")
        for name in ("workspace_bytes_per_token", "block_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise CostModelError(f"{name} must be an integer >= 1, got {value!r}")

    def batch_time(self, tokens: int, square_tokens: int) -> float:
        """Seconds to embed texts of `tokens` tokens in all, `square_tokens` the sum of their squares."""
        if tokens <= 0:
            return 0.0
        return self.base_s + self.per_token_s * tokens + self.attn_s * square_tokens / 2

    def workspace_blocks(self, padded_tokens: int) -> int:
        """Pool blocks of the workspace for `padded_tokens` (texts * longest text) tokens."""
        return max(1, math.ceil(padded_tokens * self.workspace_bytes_per_token / self.block_bytes))


@dataclass(frozen=True, slots=True)
class PoolShape:
    """The shared pool: blocks, tokens per block, and the engine's step limits."""

    total_blocks: int = 2048
    block_size: int = 16
    max_prefill_tokens: int = 2048  # chunked prefill budget per step
    max_running: int = 256


@dataclass(frozen=True, slots=True)
class LLMRequest:
    """One generated LLM request (`output_tokens` is what it will produce; the systems only
    see `max_tokens` and learn lengths as requests finish)."""

    request_id: str
    arrival_s: float
    template: int
    prefix_tokens: int
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    ttft_ms: float
    tpot_ms: float
    priority: int


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """One generated embedding request: a batch of texts."""

    request_id: str
    arrival_s: float
    texts: int
    tokens: int
    max_text_tokens: int
    square_tokens: int
    deadline_ms: float


@dataclass(frozen=True, slots=True)
class ColocationWorkload:
    """A generated run: its requests and how they were made."""

    llm: tuple[LLMRequest, ...]
    embeddings: tuple[EmbeddingRequest, ...]
    ratio: str
    load: float
    arrival: str
    output: str
    duration_s: float
    seed: int
    rate_per_s: float
    capacity_per_s: float
    settings: dict[str, object] = field(default_factory=dict)


# SLOs: a chat-like LLM objective and an interactive-retrieval embedding deadline.
LLM_TTFT_MS = 1000.0
LLM_TPOT_MS = 60.0
EMBEDDING_DEADLINE_MS = 2000.0
_PRIORITIES = (0, 1, 2)
_PRIORITY_P = (0.7, 0.2, 0.1)
_TEMPLATES = 16
_PREFIX_TOKENS = 256
_SUFFIX_TOKENS = (128, 768)
_TEXT_TOKENS = (32, 128)


def _mean_output(output: str) -> float:
    if output == "mixed":
        return float(np.mean([sum(b) / 2 for b in OUTPUT_CLASSES.values()]))
    low, high = OUTPUT_CLASSES[output]
    return (low + high) / 2


def capacity(
    llm_fraction: float,
    output: str,
    compute: str,
    *,
    cost: CostModel | None = None,
    embedding_cost: EmbeddingCostModel | None = None,
    pool: PoolShape | None = None,
) -> float:
    """Requests per second at which the mix saturates the engine (see the module docstring).

    Saturation: prefill (per prompt token), embedding batches (`EmbeddingCostModel.batch_time`
    of the mean batch; on the LLM's engine under shared compute, on their own device under
    split) and decode at the largest batch whose mean KV (prompt + half the output) fits the
    pool together take all of a device's time.
    """
    cost = cost or CostModel()
    embedding_cost = embedding_cost or EmbeddingCostModel()
    pool = pool or PoolShape()
    prompt = _PREFIX_TOKENS + sum(_SUFFIX_TOKENS) / 2
    out = _mean_output(output)
    texts = float(np.mean(BATCH_TEXTS))
    text_len = sum(_TEXT_TOKENS) / 2
    embed_s = embedding_cost.batch_time(int(texts * text_len), int(texts * text_len**2))

    request_blocks = (prompt + out / 2) / pool.block_size
    max_batch = max(1, min(pool.max_running, int(pool.total_blocks / request_blocks)))
    # Decode tokens per second of the engine's time at the largest batch the pool holds.
    decode_rate = max_batch / cost.decode_step_time(max_batch, int(max_batch * (prompt + out / 2)))

    def saturated(rate: float) -> bool:
        llm_rate = rate * llm_fraction
        prefill_busy = llm_rate * cost.prefill_time(int(prompt))
        embed_busy = rate * (1 - llm_fraction) * embed_s
        llm_other = prefill_busy + (embed_busy if compute == "shared" else 0.0)
        decode_busy = llm_rate * out / decode_rate
        return llm_other + decode_busy >= 1.0 or embed_busy >= 1.0

    low, high = 0.0, 1.0
    while not saturated(high):
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if saturated(mid) else (mid, high)
    return low


def _arrivals(
    pattern: str, rate_at: list[tuple[float, float, float]], rng: np.random.Generator
) -> list[float]:
    """Arrival times over phases ``(start, end, rate)``, by thinning a Poisson process.

    bursty: the rate is 3x for 1 s in every 5 s and 0.5x otherwise (same mean); periodic: the
    rate swings +-80 % on a 10 s sine (same mean).
    """
    times: list[float] = []
    for start, end, rate in rate_at:
        if rate <= 0:
            continue
        peak = rate * (3.0 if pattern == "bursty" else 1.8 if pattern == "periodic" else 1.0)
        t = start
        while True:
            t += float(rng.exponential(1.0 / peak))
            if t >= end:
                break
            if pattern == "bursty":
                here = rate * (3.0 if (t % 5.0) < 1.0 else 0.5)
            elif pattern == "periodic":
                here = rate * (1.0 + 0.8 * math.sin(2 * math.pi * t / 10.0))
            else:
                here = rate
            if float(rng.random()) * peak < here:
                times.append(t)
    return times


def generate(
    *,
    ratio: str = "5:5",
    load: float = 1.0,
    arrival: str = "poisson",
    output: str = "medium",
    compute: str = "shared",
    duration_s: float = 60.0,
    seed: int = 0,
    cost: CostModel | None = None,
    embedding_cost: EmbeddingCostModel | None = None,
    pool: PoolShape | None = None,
) -> ColocationWorkload:
    """A seeded colocation workload (see the module docstring).

    Raises:
        ValueError: A bad ratio, load, arrival pattern, output class, compute mode or duration.
    """
    llm_fraction = _checked_fraction(ratio, load, arrival, output, compute, duration_s)
    rng = np.random.default_rng(seed)
    fractions = [llm_fraction] if llm_fraction is not None else list(_SHIFT_PHASES)
    bounds = np.linspace(0.0, duration_s, len(fractions) + 1)
    phases = []
    for i, fraction in enumerate(fractions):
        cap = capacity(fraction, output, compute, cost=cost, embedding_cost=embedding_cost, pool=pool)
        phases.append((float(bounds[i]), float(bounds[i + 1]), cap * load, fraction))
    llm_times = _arrivals(arrival, [(s, e, rate * f) for s, e, rate, f in phases], rng)
    embedding_times = _arrivals(arrival, [(s, e, rate * (1 - f)) for s, e, rate, f in phases], rng)
    llm = _llm_requests(llm_times, output, rng)
    embeddings = _embedding_requests(embedding_times, rng)
    mean_rate = sum((e - s) * r for s, e, r, _ in phases) / duration_s
    mean_capacity = sum((e - s) * r / load for s, e, r, _ in phases) / duration_s
    return ColocationWorkload(
        llm=llm,
        embeddings=embeddings,
        ratio=ratio,
        load=float(load),
        arrival=arrival,
        output=output,
        duration_s=float(duration_s),
        seed=seed,
        rate_per_s=mean_rate,
        capacity_per_s=mean_capacity,
        settings={"compute": compute, "phases": [(s, e, r, f) for s, e, r, f in phases]},
    )


def _checked_fraction(
    ratio: str, load: float, arrival: str, output: str, compute: str, duration_s: float
) -> float | None:
    """The LLM fraction of `ratio` (None: the shifting mix), once every option is checked."""
    llm_fraction = parse_ratio(ratio)
    if not (isinstance(load, int | float) and math.isfinite(load) and load > 0):
        raise ValueError(f"load must be a number > 0, got {load!r}")
    if arrival not in ARRIVAL_PATTERNS:
        raise ValueError(f"arrival must be one of {', '.join(ARRIVAL_PATTERNS)}, got {arrival!r}")
    if output not in (*OUTPUT_CLASSES, "mixed"):
        raise ValueError(f"output must be one of {', '.join(OUTPUT_CLASSES)}, mixed; got {output!r}")
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {', '.join(COMPUTE_MODES)}, got {compute!r}")
    if not (isinstance(duration_s, int | float) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be a number of seconds > 0, got {duration_s!r}")
    return llm_fraction


def _llm_requests(times: list[float], output: str, rng: np.random.Generator) -> tuple[LLMRequest, ...]:
    """LLM requests arriving at `times`: a template, a prompt and an output length each."""
    classes = list(OUTPUT_CLASSES) if output == "mixed" else [output]
    max_tokens = max(OUTPUT_CLASSES[c][1] for c in classes)
    llm = []
    for i, t in enumerate(times):
        cls = classes[int(rng.integers(len(classes)))]
        low, high = OUTPUT_CLASSES[cls]
        llm.append(
            LLMRequest(
                request_id=f"l{i}",
                arrival_s=t,
                template=int(rng.integers(_TEMPLATES)),
                prefix_tokens=_PREFIX_TOKENS,
                prompt_tokens=_PREFIX_TOKENS + int(rng.integers(_SUFFIX_TOKENS[0], _SUFFIX_TOKENS[1] + 1)),
                output_tokens=int(rng.integers(low, high + 1)),
                max_tokens=max_tokens,
                ttft_ms=LLM_TTFT_MS,
                tpot_ms=LLM_TPOT_MS,
                priority=int(rng.choice(_PRIORITIES, p=_PRIORITY_P)),
            )
        )
    return tuple(llm)


def _embedding_requests(times: list[float], rng: np.random.Generator) -> tuple[EmbeddingRequest, ...]:
    """Embedding batches arriving at `times`: 16-128 texts of 32-128 tokens each."""
    embeddings = []
    for i, t in enumerate(times):
        texts = int(rng.choice(BATCH_TEXTS))
        lengths = rng.integers(_TEXT_TOKENS[0], _TEXT_TOKENS[1] + 1, size=texts)
        embeddings.append(
            EmbeddingRequest(
                request_id=f"e{i}",
                arrival_s=t,
                texts=texts,
                tokens=int(lengths.sum()),
                max_text_tokens=int(lengths.max()),
                square_tokens=int((lengths.astype(np.int64) ** 2).sum()),
                deadline_ms=EMBEDDING_DEADLINE_MS,
            )
        )
    return tuple(embeddings)
