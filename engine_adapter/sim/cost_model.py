"""How long a forward pass takes, for the simulator's virtual clock.

The model is linear in a few features, so that it can be fitted by least squares from a
handful of timings of the real engine (`calibrate`):

    prefill_time(tokens, batch, cached_tokens)
        = prefill_base_s
        + prefill_per_token_s * tokens
        + prefill_attn_s      * tokens * (cached_tokens + tokens / 2) / batch

    decode_step_time(batch, context_tokens)
        = decode_base_s
        + decode_per_seq_s           * batch
        + decode_per_context_token_s * context_tokens

    load_time(host_tokens, disk_tokens)
        = host_link_latency_s + kv_bytes_per_token * host_tokens / host_link_bytes_per_s
        + disk_link_latency_s + kv_bytes_per_token * disk_tokens / disk_link_bytes_per_s

`tokens` are the prompt tokens computed in the step (summed over the `batch` sequences),
`cached_tokens` the prefix tokens served from the cache that they attend to, and
`context_tokens` the KV tokens a decode step reads (summed over the batch). The attention term
is the number of (query, key) pairs of causal attention, exact for equal-length sequences;
prefix-cache hits cut `tokens` and add to `cached_tokens`, so a hit saves the linear term and
most of the quadratic one. A step that mixes prefill and decode (`step_time`) pays one base.

The defaults approximate a 7B Llama-architecture model (32 layers, d_model 4096, multi-head
attention, fp16 weights and KV) on one A100-80GB with vLLM-class kernels. They are derived, not
measured: ~14 GFLOP per prompt token at ~170 TFLOP/s (55 % of peak) gives 8e-5 s per token;
~0.5 MFLOP per attention pair at ~150 TFLOP/s gives 3.5e-9 s; a decode step reads 13.5 GB of
weights at ~1.5 TB/s (~9 ms, plus launch overhead: 10 ms) and 0.5 MB of KV per context token
(3.2e-7 s per token). Calibrate against the engine before reading absolute times.

The KV tiers' links (docs/architecture.md, "Tiers"): `load_time` is what a step pays, before
its forward, to load the blocks its admissions found in the host or disk tier (each term only
when that tier loads something: one transfer's latency, then the bytes at the link's
bandwidth). Demotions copy the other way (device to host) on the other direction of the
full-duplex link, overlapped with compute, and are not charged. `LINKS` holds the defaults:
PCIe 4.0 x16 (~25 GB/s effective, the A100's host link), PCIe 5.0 x16 (~50 GB/s, H100 class)
and an NVMe drive (~5 GB/s reads, ~100 us per read); `with_links("pcie5", "nvme")` sets them.
`kv_bytes_per_token` is the 7B model's 0.5 MiB (32 layers x K and V x 4096 x 2 bytes).

Bad values raise `CostModelError` (a `ValueError`) naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from engine_adapter.safe_yaml import YAMLInputError, load_yaml_file

__all__ = [
    "LINKS",
    "CostModel",
    "CostModelError",
    "calibrate",
]


class CostModelError(ValueError):
    """A cost model that cannot be built: a bad file, an unknown key, a bad value, too few samples."""


LINKS: dict[str, tuple[float, float]] = {
    "pcie4": (25e9, 10e-6),  # PCIe 4.0 x16: 32 GB/s raw, ~25 GB/s by DMA; ~10 us per transfer
    "pcie5": (50e9, 10e-6),  # PCIe 5.0 x16: 64 GB/s raw, ~50 GB/s by DMA
    "nvme": (5e9, 100e-6),  # one PCIe 4.0 NVMe drive: ~5-7 GB/s sequential reads, ~100 us per read
}
"""Link presets: name -> (bytes per second, seconds of latency per transfer)."""

_LINK_FIELDS = (
    "kv_bytes_per_token",
    "host_link_bytes_per_s",
    "host_link_latency_s",
    "disk_link_bytes_per_s",
    "disk_link_latency_s",
)

_COEFFICIENTS = (
    "prefill_base_s",
    "prefill_per_token_s",
    "prefill_attn_s",
    "decode_base_s",
    "decode_per_seq_s",
    "decode_per_context_token_s",
)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Prefill and decode step times as linear functions of tokens and batch (see the module docstring).

    Attributes:
        name: What the coefficients describe (model, GPU, how they were obtained).
        prefill_base_s: Fixed cost of a prefill step.
        prefill_per_token_s: Cost per prompt token computed.
        prefill_attn_s: Cost per causal attention (query, key) pair.
        decode_base_s: Fixed cost of a decode step (weights read, launches).
        decode_per_seq_s: Cost per sequence in the decode batch.
        decode_per_context_token_s: Cost per KV token read by the decode step.
        kv_bytes_per_token: K/V bytes of one token (all layers), what a tier load moves.
        host_link_bytes_per_s, host_link_latency_s: The host tier's link (default PCIe 4).
        disk_link_bytes_per_s, disk_link_latency_s: The disk tier's link (default NVMe).
    """

    name: str = "llama-7b-fp16 on A100-80GB (estimated from FLOPs and bandwidth, not measured)"
    prefill_base_s: float = 0.010
    prefill_per_token_s: float = 8.0e-5
    prefill_attn_s: float = 3.5e-9
    decode_base_s: float = 0.010
    decode_per_seq_s: float = 5.0e-5
    decode_per_context_token_s: float = 3.2e-7
    kv_bytes_per_token: float = 524288.0
    host_link_bytes_per_s: float = LINKS["pcie4"][0]
    host_link_latency_s: float = LINKS["pcie4"][1]
    disk_link_bytes_per_s: float = LINKS["nvme"][0]
    disk_link_latency_s: float = LINKS["nvme"][1]

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise CostModelError(f"name must be a string, got {self.name!r}")
        for key in ("host_link_bytes_per_s", "disk_link_bytes_per_s"):
            value = getattr(self, key)
            if type(value) in (int, float) and value == 0:
                raise CostModelError(f"{key} must be a positive number of bytes per second, got {value!r}")
        for key in _COEFFICIENTS + _LINK_FIELDS:
            value = getattr(self, key)
            if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
                raise CostModelError(f"{key} must be a finite number >= 0 (seconds), got {value!r}")
            object.__setattr__(self, key, float(value))

    # ------------------------------------------------------------------ times

    def prefill_time(self, tokens: int, batch: int = 1, cached_tokens: int = 0) -> float:
        """Seconds of a prefill step computing `tokens` prompt tokens of `batch` sequences.

        Args:
            tokens: Prompt tokens computed (cache misses), summed over the batch.
            batch: Sequences in the step (>= 1).
            cached_tokens: Cached prefix tokens they attend to, summed over the batch.
        """
        if tokens <= 0:
            return 0.0
        pairs = tokens * (cached_tokens + tokens / 2) / max(batch, 1)
        return self.prefill_base_s + self.prefill_per_token_s * tokens + self.prefill_attn_s * pairs

    def decode_step_time(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of `batch` sequences reading `context_tokens` KV tokens in all."""
        if batch <= 0:
            return 0.0
        return (
            self.decode_base_s
            + self.decode_per_seq_s * batch
            + self.decode_per_context_token_s * context_tokens
        )

    def load_time(self, host_tokens: int, disk_tokens: int = 0) -> float:
        """Seconds to load `host_tokens` tokens' K/V from the host tier and `disk_tokens` from
        the disk tier into the device pool (one transfer per tier that loads anything)."""
        seconds = 0.0
        if host_tokens > 0:
            seconds += (
                self.host_link_latency_s + self.kv_bytes_per_token * host_tokens / self.host_link_bytes_per_s
            )
        if disk_tokens > 0:
            seconds += (
                self.disk_link_latency_s + self.kv_bytes_per_token * disk_tokens / self.disk_link_bytes_per_s
            )
        return seconds

    def with_links(self, host: str | None = None, disk: str | None = None) -> CostModel:
        """This model with the host and/or disk link set from `LINKS` (``pcie4``, ``pcie5``, ``nvme``).

        Raises:
            CostModelError: An unknown link name.
        """
        updates: dict[str, Any] = {}
        for tier, name in (("host", host), ("disk", disk)):
            if name is None:
                continue
            if name not in LINKS:
                raise CostModelError(f"unknown {tier} link {name!r}; links: {', '.join(LINKS)}")
            updates[f"{tier}_link_bytes_per_s"], updates[f"{tier}_link_latency_s"] = LINKS[name]
        return replace(self, **updates) if updates else self

    def step_time(
        self,
        *,
        prefill_tokens: int = 0,
        prefill_batch: int = 0,
        cached_tokens: int = 0,
        decode_batch: int = 0,
        context_tokens: int = 0,
    ) -> float:
        """Seconds of one engine step that may mix prefill (chunked) and decode; one base is paid."""
        prefill = self.prefill_time(prefill_tokens, prefill_batch, cached_tokens)
        decode = self.decode_step_time(decode_batch, context_tokens)
        if prefill and decode:
            return prefill + decode - min(self.prefill_base_s, self.decode_base_s)
        return prefill + decode

    # ------------------------------------------------------------------ files

    def to_dict(self) -> dict[str, Any]:
        """The fields, as `from_dict` and `from_yaml` read them."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: object, *, where: str = "cost model") -> CostModel:
        """Build from a mapping of field names to values; missing fields keep their defaults.

        Raises:
            CostModelError: `values` is not a mapping, names an unknown key or holds a bad value.
        """
        if not isinstance(values, dict):
            raise CostModelError(
                f"{where}: expected a mapping of cost-model keys, got {type(values).__name__}"
            )
        known = [f.name for f in fields(cls)]
        unknown = [str(key) for key in values if key not in known]
        if unknown:
            raise CostModelError(
                f"{where}: unknown key(s) {', '.join(sorted(unknown))}; keys: {', '.join(known)}"
            )
        try:
            return cls(**values)
        except CostModelError as exc:
            raise CostModelError(f"{where}: {exc}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> CostModel:
        """Read a YAML mapping of field names to values (e.g. one that `to_yaml` wrote).

        Raises:
            CostModelError: The file cannot be read or parsed, or `from_dict` rejects it.
        """
        try:
            values = load_yaml_file(path)
        except FileNotFoundError:
            raise CostModelError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise CostModelError(f"{path}: cannot read: {exc}") from None
        except YAMLInputError as exc:
            raise CostModelError(f"{path}: bad YAML: {exc}") from None
        return cls.from_dict({} if values is None else values, where=str(path))

    def to_yaml(self, path: str | Path) -> None:
        """Write the fields as YAML that `from_yaml` reads back unchanged."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False), encoding="utf-8")


# ---------------------------------------------------------------------- calibration

PrefillSample = Sequence[float]
"""``(tokens, batch, seconds)`` or ``(tokens, batch, seconds, cached_tokens)``."""
DecodeSample = Sequence[float]
"""``(context_tokens, batch, seconds)``."""


def _rows(samples: Iterable[Sequence[float]], kind: str, widths: tuple[int, ...]) -> np.ndarray:
    rows = []
    for i, sample in enumerate(samples):
        if (
            not isinstance(sample, Sequence | np.ndarray)
            or len(sample) not in widths
            or any(type(v) not in (int, float) and not isinstance(v, np.number) for v in sample)
        ):
            shape = " or ".join(f"{w} numbers" for w in widths)
            raise CostModelError(f"{kind} sample {i}: expected {shape}, got {sample!r}")
        row = [float(v) for v in sample] + [0.0] * (max(widths) - len(sample))
        if not all(math.isfinite(v) and v >= 0 for v in row) or row[1] < 1:
            raise CostModelError(f"{kind} sample {i}: values must be finite and >= 0, batch >= 1: {sample!r}")
        rows.append(row)
    return np.asarray(rows, dtype=np.float64).reshape(-1, max(widths))


def _fit(features: np.ndarray, seconds: np.ndarray, fallback: np.ndarray, kind: str) -> np.ndarray:
    """Non-negative least squares over the identifiable columns; the others keep `fallback`.

    A column that adds no rank to the ones before it (e.g. batch when every sample has batch 1)
    cannot be told apart from them, so its coefficient is held at `fallback` and its share
    subtracted; a coefficient that comes out negative is held at 0 and the rest refitted.
    """
    n_columns = features.shape[1]
    free: list[int] = []
    for column in range(n_columns):
        trial = [*free, column]
        if np.linalg.matrix_rank(features[:, trial]) == len(trial):
            free.append(column)
    if not free:
        raise CostModelError(f"{kind}: the samples determine no coefficient")
    coefficients = fallback.astype(np.float64).copy()
    while True:
        fixed = [c for c in range(n_columns) if c not in free]
        target = seconds - features[:, fixed] @ coefficients[fixed]
        solution, *_ = np.linalg.lstsq(features[:, free], target, rcond=None)
        negative = [column for column, value in zip(free, solution, strict=True) if value < 0]
        if not negative:
            coefficients[free] = solution
            return coefficients
        for column in negative:
            coefficients[column] = 0.0
            free.remove(column)
        if not free:
            return coefficients


def calibrate(
    prefill: Iterable[PrefillSample] = (),
    decode: Iterable[DecodeSample] = (),
    *,
    base: CostModel | None = None,
    name: str | None = None,
) -> CostModel:
    """Fit the coefficients to measured step times by (non-negative) least squares.

    Args:
        prefill: Measured prefill steps, ``(tokens, batch, seconds)`` or
            ``(tokens, batch, seconds, cached_tokens)``; vary tokens (and batch or cached tokens
            for the attention term to be told apart from the linear one).
        decode: Measured decode steps, ``(context_tokens, batch, seconds)``; vary both.
        base: The model whose coefficients are kept where the samples say nothing (no samples
            of a kind, or a feature that never varies); `CostModel()` when omitted.
        name: The `name` of the result (default: "calibrated (N prefill, M decode samples)").

    Returns:
        A new `CostModel`.

    Raises:
        CostModelError: A malformed sample, or no samples at all.
    """
    base = base if base is not None else CostModel()
    prefill_rows = _rows(prefill, "prefill", (3, 4))
    decode_rows = _rows(decode, "decode", (3,))
    if not len(prefill_rows) and not len(decode_rows):
        raise CostModelError("calibrate needs prefill or decode samples")
    updates: dict[str, float] = {}
    if len(prefill_rows):
        tokens, batch, seconds, cached = prefill_rows.T
        features = np.column_stack((np.ones_like(tokens), tokens, tokens * (cached + tokens / 2) / batch))
        fallback = np.array([base.prefill_base_s, base.prefill_per_token_s, base.prefill_attn_s])
        fitted = _fit(features, seconds, fallback, "prefill")
        updates.update(zip(_COEFFICIENTS[:3], fitted.tolist(), strict=True))
    if len(decode_rows):
        context, batch, seconds = decode_rows.T
        features = np.column_stack((np.ones_like(context), batch, context))
        fallback = np.array([base.decode_base_s, base.decode_per_seq_s, base.decode_per_context_token_s])
        fitted = _fit(features, seconds, fallback, "decode")
        updates.update(zip(_COEFFICIENTS[3:], fitted.tolist(), strict=True))
    label = (
        name
        if name is not None
        else (f"calibrated ({len(prefill_rows)} prefill, {len(decode_rows)} decode samples)")
    )
    return replace(base, name=label, **updates)
