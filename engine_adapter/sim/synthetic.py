"""Generated request streams: seeded synthetic workloads and the presets.

`synthetic(...)` draws Poisson, bursty or periodic arrivals, lognormal lengths and multi-turn
sessions over a seeded `PrefixModel`; `preset("spec")` is the module spec's benchmark scenario.

In `synthetic`, a first turn's prompt is its system prompt (if any) plus lognormal user tokens
(mean `input_tokens`); a later turn's prompt is the previous prompt, the previous output and
lognormal new tokens (mean `turn_tokens`), so it extends the previous prompt's blocks. A turn
that would exceed `max_input_tokens` opens a new conversation instead. Outputs are lognormal
(mean `output_tokens`, at least 1). Arrivals, lengths and prefixes use separate random streams
derived from `seed`, so changing the rate does not change the prefixes.
Both return a `Workload` (`engine_adapter.sim.workloads`) like the trace readers, its requests a
`RequestTable` filled request by request (every key in one int32 or int64 array, no
`SimRequest` or tuple of keys per request held); `synthetic_stream` yields the same requests as
`SimRequest`s one at a time.

Pure Python and numpy; imports the workload records, the request table and the prefix model,
neither torch nor the rest of `engine_adapter`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine_adapter.sim.prefix_model import PrefixBuilder, PrefixModel, Turn
from engine_adapter.sim.request_table import RequestTable
from engine_adapter.sim.workloads import SimRequest, Workload, WorkloadError, check_float, check_int

__all__ = [
    "ARRIVALS",
    "PRESETS",
    "preset",
    "spec_benchmark",
    "synthetic",
    "synthetic_params",
    "synthetic_stream",
]

ARRIVALS = ("poisson", "bursty", "periodic")


# --------------------------------------------------------------------------- synthetic


def _arrival_times(
    kind: str,
    rate: float,
    burstiness: float,
    requests: int | None,
    duration: float | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """Arrival times from 0: `requests` of them, or those before `duration`, whichever ends first."""

    def gaps(n: int) -> np.ndarray:
        if kind == "poisson":
            drawn: np.ndarray = rng.exponential(1.0 / rate, size=n)
        elif kind == "bursty":  # gamma inter-arrivals with coefficient of variation `burstiness`
            shape = 1.0 / burstiness**2
            drawn = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        else:
            drawn = np.full(n, 1.0 / rate)
        return drawn

    if requests is not None:
        times = np.concatenate(([0.0], np.cumsum(gaps(requests - 1)))) if requests else np.zeros(0)
        if duration is not None:
            times = times[times < duration]
        return times
    assert duration is not None  # checked by the caller
    chunk = int(rate * duration * 1.1) + 64
    times = np.concatenate(([0.0], np.cumsum(gaps(chunk))))
    while times[-1] < duration:
        times = np.concatenate((times, times[-1] + np.cumsum(gaps(chunk))))
    end: int = int(np.searchsorted(times, duration, side="left"))
    return times[:end]


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, n: int, low: int) -> np.ndarray:
    """Integer lengths from a lognormal with the given mean, at least `low`."""
    mu = math.log(mean) - sigma**2 / 2
    drawn: np.ndarray = np.maximum(np.rint(rng.lognormal(mu, sigma, size=n)), low).astype(np.int64)
    return drawn


@dataclass(frozen=True, slots=True)
class _Traffic:
    """The arrival process and the length distributions of `synthetic` (checked on creation)."""

    requests: int | None
    rate: float
    duration: float | None
    arrival: str
    burstiness: float
    input_tokens: float
    input_sigma: float
    turn_tokens: float
    output_tokens: float
    output_sigma: float
    max_input_tokens: int
    seed: int

    def __post_init__(self) -> None:
        if self.requests is None and self.duration is None:
            raise WorkloadError("synthetic needs requests or duration (or both)")
        if self.requests is not None:
            check_int("requests", self.requests, 1)
        if self.duration is not None:
            check_float("duration", self.duration, 0.0)
            if self.duration <= 0:
                raise WorkloadError(f"duration must be > 0, got {self.duration!r}")
        check_float("rate", self.rate, 0.0)
        if self.rate <= 0:
            raise WorkloadError(f"rate must be > 0 requests/s, got {self.rate!r}")
        if self.arrival not in ARRIVALS:
            raise WorkloadError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        check_float("burstiness", self.burstiness, 0.0)
        if self.burstiness <= 0:
            raise WorkloadError(f"burstiness must be > 0, got {self.burstiness!r}")
        for name in ("input_tokens", "turn_tokens", "output_tokens"):
            check_float(name, getattr(self, name), 1.0)
        check_float("input_sigma", self.input_sigma, 0.0)
        check_float("output_sigma", self.output_sigma, 0.0)
        check_int("max_input_tokens", self.max_input_tokens, 1)
        check_int("seed", self.seed, 0)


def synthetic(
    *,
    requests: int | None = 1000,
    rate: float = 10.0,
    duration: float | None = None,
    arrival: str = "poisson",
    burstiness: float = 4.0,
    input_tokens: float = 512.0,
    input_sigma: float = 1.0,
    turn_tokens: float = 128.0,
    output_tokens: float = 128.0,
    output_sigma: float = 0.8,
    max_input_tokens: int = 32768,
    seed: int = 0,
    **prefix: Any,
) -> Workload:
    """A seeded synthetic workload: arrivals, lengths and the `PrefixModel`'s prefix structure
    (how turns and prompts are drawn: the module docstring).

    Args:
        requests: Number of requests (None: as many as arrive within `duration`).
        rate: Mean arrival rate, requests per second.
        duration: Stop at this many seconds (None: stop after `requests`).
        arrival: `"poisson"` (exponential gaps), `"bursty"` (gamma gaps with coefficient of
            variation `burstiness`) or `"periodic"` (a request every `1 / rate` seconds).
        burstiness: Coefficient of variation of the gaps for `"bursty"` (> 1 is burstier than
            Poisson).
        input_tokens: Mean user tokens of a first turn.
        input_sigma: Sigma of the lognormal of user tokens (first and later turns).
        turn_tokens: Mean new user tokens of a later turn.
        output_tokens: Mean output tokens.
        output_sigma: Sigma of the lognormal of output tokens.
        max_input_tokens: Longest prompt a conversation may grow to.
        seed: Seed of everything random.
        **prefix: The other `PrefixModel` fields (`block_size`, `sessions`, `session_skew`,
            `turns`, `system_prompts`, `system_prompt_tokens`, `p_system`, `tenants`,
            `priority_weights`); `tenants` defaults to 1 here (a single tenant `"t0"`).

    Returns:
        The workload, sorted by arrival (a `RequestTable`).

    Raises:
        WorkloadError: A parameter is out of range.
        TypeError: A keyword that is neither a parameter nor a `PrefixModel` field.
    """
    traffic = _Traffic(
        requests, rate, duration, arrival, burstiness, input_tokens, input_sigma,
        turn_tokens, output_tokens, output_sigma, max_input_tokens, seed,
    )  # fmt: skip
    model = _prefix_model(seed, prefix)
    out = RequestTable()
    for turn in _synthetic_turns(traffic, model):
        out.add(*turn)
    params: dict[str, Any] = {
        field.name: getattr(traffic, field.name) for field in fields(_Traffic) if field.name != "seed"
    }
    return Workload(
        requests=out, block_size=model.block_size, source="synthetic", params={**params, **model.to_dict()}
    )


def synthetic_stream(**params: Any) -> Iterator[SimRequest]:
    """The requests `synthetic(**params)` returns, one at a time in arrival order, without the
    list: what is held is a few numbers per request (the arrivals and lengths, drawn up front)
    and each open conversation's blocks, not every request's keys (a generated trace of 10^8
    lookups is written out in bounded memory). The parameters are checked before the first one.

    Raises:
        WorkloadError: A parameter is out of range.
        TypeError: A keyword that is neither a parameter of `synthetic` nor a `PrefixModel` field.
    """
    bound = inspect.signature(synthetic).bind(**params)
    bound.apply_defaults()
    args = bound.arguments
    prefix = args.pop("prefix")
    traffic = _Traffic(**args)
    return (SimRequest(*turn) for turn in _synthetic_turns(traffic, _prefix_model(traffic.seed, prefix)))


def _prefix_model(seed: int, prefix: dict[str, Any]) -> PrefixModel:
    """`synthetic`'s prefix model: its seed, one tenant unless told otherwise."""
    if "priority_weights" in prefix:
        prefix = {**prefix, "priority_weights": tuple(prefix["priority_weights"])}
    return PrefixModel(seed=seed, **{"tenants": 1, **prefix})


def synthetic_params() -> dict[str, str]:
    """The keyword params `synthetic` takes, with their annotations as strings (for the CLI)."""
    return {**_annotations(synthetic), **{f.name: str(f.type) for f in fields(PrefixModel)}}


def _synthetic_turns(traffic: _Traffic, model: PrefixModel) -> Iterator[Turn]:
    """The requests' fields in arrival order: arrivals, lengths and prefixes from separate streams
    derived from the seed, all drawn before the first request is made (so it is a pure function
    of them). Each turn is counted against its conversation before it is yielded, so a consumer
    that keeps no request (a table, the stream) sees the same sequence."""
    arrival_rng, length_rng, prefix_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(traffic.seed).spawn(3)
    )
    arrivals = _arrival_times(
        traffic.arrival, traffic.rate, traffic.burstiness, traffic.requests, traffic.duration, arrival_rng
    ).tolist()
    n = len(arrivals)
    user_tokens = _lognormal_tokens(length_rng, traffic.input_tokens, traffic.input_sigma, n, 1).tolist()
    new_tokens = _lognormal_tokens(length_rng, traffic.turn_tokens, traffic.input_sigma, n, 1).tolist()
    output_lens = _lognormal_tokens(length_rng, traffic.output_tokens, traffic.output_sigma, n, 1).tolist()

    builder = PrefixBuilder(model, n, prefix_rng)
    system_tokens = model.system_prompt_tokens
    max_input_tokens = traffic.max_input_tokens
    for i, arrival_s in enumerate(arrivals):
        slot, conversation = builder.slot(i)
        if conversation is not None:
            input_len = conversation.input_len + conversation.output_len + new_tokens[i]
            if input_len > max_input_tokens:
                conversation = None
            else:
                blocks = builder.next_turn(conversation, input_len)
        if conversation is None:
            conversation, system = builder.start(slot)
            input_len = min((system_tokens if system else 0) + user_tokens[i], max_input_tokens)
            blocks = builder.first_turn(conversation, system, input_len)
        yield builder.turn(i, arrival_s, blocks, input_len, output_lens[i], conversation)


# --------------------------------------------------------------------------- presets


def spec_benchmark(
    *,
    sequences: int = 1000,
    blocks_per_sequence: int = 10,
    max_access_count: int = 10,
    priorities: int = 3,
    duration: float = 60.0,
    output_tokens: int = 32,
    block_size: int = 16,
    tenants: int = 0,
    seed: int = 0,
) -> Workload:
    """The module spec's benchmark scenario ("Benchmark 场景" of the module spec) as a request stream.

    Sequence `i` owns blocks `i*10 .. i*10+9` (the spec's `block_ids`), has a priority drawn
    uniformly from `0 .. priorities-1` and an access count drawn uniformly from
    `1 .. max_access_count`. Each access is one request for the whole sequence prefix (session
    `"seq{i}"`), at a time uniform over `[0, duration)` (the spec's `--duration 60`); an access
    after the first finds the blocks in cache unless they were evicted, which is the
    re-prefill the spec measures. The spec names no tenants; `tenants > 0` assigns sequence
    `i` to tenant `"t{i % tenants}"`.

    Args:
        sequences: Number of sequences.
        blocks_per_sequence: Blocks of each sequence's prompt.
        max_access_count: Largest access count (the spec's `random.randint(1, 10)`).
        priorities: Number of priority levels (the spec's `random.randint(0, 2)`).
        duration: Seconds over which the accesses arrive.
        output_tokens: Output tokens of every request (the spec names none).
        block_size: Tokens per block.
        tenants: Tenants to spread the sequences over (0: none).
        seed: Seed of the draws.

    Returns:
        The workload, sorted by arrival (a `RequestTable`).
    """
    params: dict[str, Any] = {
        "sequences": sequences,
        "blocks_per_sequence": blocks_per_sequence,
        "max_access_count": max_access_count,
        "priorities": priorities,
        "duration": duration,
        "output_tokens": output_tokens,
        "block_size": block_size,
        "tenants": tenants,
        "seed": seed,
    }
    for name, low in _SPEC_MINIMUM.items():
        check_int(name, params[name], low)
    check_float("duration", duration, 0.0)
    return Workload(requests=_spec_requests(**params), block_size=block_size, source="spec", params=params)


_SPEC_MINIMUM = {
    "sequences": 1,
    "blocks_per_sequence": 1,
    "max_access_count": 1,
    "priorities": 1,
    "output_tokens": 0,
    "block_size": 1,
    "tenants": 0,
    "seed": 0,
}
"""The integer params of `spec_benchmark` and their least values, in the order they are checked."""


def _spec_requests(
    *,
    sequences: int,
    blocks_per_sequence: int,
    max_access_count: int,
    priorities: int,
    duration: float,
    output_tokens: int,
    block_size: int,
    tenants: int,
    seed: int,
) -> RequestTable:
    """The accesses of `spec_benchmark`, in arrival order (its docstring)."""
    rng = np.random.default_rng(seed)
    priority_of = rng.integers(0, priorities, size=sequences).tolist()
    count_of = rng.integers(1, max_access_count + 1, size=sequences)
    sequence_of = np.repeat(np.arange(sequences), count_of)
    arrivals = rng.uniform(0.0, duration, size=len(sequence_of))
    order = np.argsort(arrivals, kind="stable")
    input_len = blocks_per_sequence * block_size
    table = RequestTable()
    for request_id, (k, seq) in enumerate(zip(order.tolist(), sequence_of[order].tolist(), strict=True)):
        first = seq * blocks_per_sequence
        table.add(
            request_id,
            float(arrivals[k]),
            range(first, first + blocks_per_sequence),
            input_len,
            output_tokens,
            f"t{seq % tenants}" if tenants else None,
            priority_of[seq],
            f"seq{seq}",
        )
    return table


PRESETS: dict[str, Callable[..., Workload]] = {"spec": spec_benchmark}
"""Named workloads: name -> function taking keyword params (all with defaults) and `seed`."""


def preset(name: str, *, seed: int = 0, **params: Any) -> Workload:
    """A named workload from `PRESETS`, e.g. ``preset("spec", seed=1)``.

    Raises:
        WorkloadError: An unknown name or param.
    """
    try:
        build = PRESETS[name]
    except KeyError:
        raise WorkloadError(f"unknown preset {name!r}; presets: {', '.join(sorted(PRESETS))}") from None
    _reject_unknown(_annotations(build), params, f"preset {name!r}")
    return build(seed=seed, **params)


def _annotations(build: Callable[..., Any]) -> dict[str, str]:
    """Keyword params of `build` (a source function) and their annotations, as strings."""
    return {
        name: str(param.annotation)
        for name, param in inspect.signature(build).parameters.items()
        if param.kind is param.KEYWORD_ONLY
    }


def _reject_unknown(accepted: Iterable[str], params: dict[str, Any], what: str) -> None:
    names = list(accepted)
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise WorkloadError(f"{what} takes no param(s) {', '.join(unknown)}; params: {', '.join(names)}")
