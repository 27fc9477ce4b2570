"""The config of SLOs and of LLM + embedding colocation: the parsers of their keys and params.

``slo_ttft_ms`` and its kin, ``tenant_slos`` (``"a:ttft_ms=500,tpot_ms=50;b:deadline_ms=200"``),
the ``colocation`` mode (``off``, ``dynamic``, ``static:F``) and ``colocation_params``: the
`ColocationParams` constants (`colocation_params`) and the engine's switches beside them
(`colocation_switches`).

Imports: the standard library and `values`; `engine_adapter.colocation` (pure Python) only when
colocation params are parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine_adapter.serving.config.values import (
    ConfigError,
    fail,
    float_in,
    parse_bool,
    parse_params,
    parse_text,
)

if TYPE_CHECKING:
    from engine_adapter.colocation import ColocationParams

__all__ = [
    "SLO_KEYS",
    "SWITCH_PARAMS",
    "SYSTEM_PARAM",
    "colocation_params",
    "colocation_switches",
    "parse_colocation_mode",
    "parse_slo_ms",
    "parse_tenant_slos",
]

SLO_KEYS = ("ttft_ms", "tpot_ms", "deadline_ms")
COLOCATION_MODE = re.compile(r"^(off|dynamic|static:(0(\.[0-9]+)?|1(\.0*)?|\.[0-9]+))$")


def parse_slo_ms(value: Any, where: str) -> float:
    ms = float_in(0.0, 86_400_000.0, low_open=True)(value, where)
    return ms


def parse_tenant_slos(value: Any, where: str) -> dict[str, dict[str, float]]:
    """``{tenant: {ttft_ms, tpot_ms, deadline_ms}}``, or ``"a:ttft_ms=500,tpot_ms=50;b:..."``."""
    if isinstance(value, str):
        parsed: dict[str, Any] = {}
        for part in (p.strip() for p in value.split(";")):
            if not part:
                continue
            tenant, colon, rest = part.partition(":")
            if not colon or not tenant.strip():
                raise fail(where, part, "of the form TENANT:ttft_ms=MS,tpot_ms=MS,deadline_ms=MS")
            parsed[tenant.strip()] = parse_params(rest, f"{where}.{tenant.strip()}")
        value = parsed
    if not isinstance(value, Mapping):
        raise fail(where, value, "a mapping of tenants to their SLOs")
    out: dict[str, dict[str, float]] = {}
    for tenant, slos in value.items():
        if not isinstance(tenant, str) or not tenant:
            raise fail(where, tenant, "a tenant name")
        if not isinstance(slos, Mapping):
            raise fail(f"{where}.{tenant}", slos, "a mapping of ttft_ms, tpot_ms, deadline_ms")
        unknown = sorted(set(map(str, slos)) - set(SLO_KEYS))
        if unknown:
            raise ConfigError(f"{where}.{tenant}: unknown SLO {unknown[0]!r}; known: {', '.join(SLO_KEYS)}")
        out[tenant] = {str(k): parse_slo_ms(v, f"{where}.{tenant}.{k}") for k, v in slos.items()}
    return out


SYSTEM_PARAM = "system"  # ``colocation_params: system=spec`` runs the spec's algorithms as written
# Engine switches beside the controller's constants: ``admission=false`` admits every request on
# arrival and sheds nothing; ``slo_preemption=false`` leaves preemption to the eviction policy.
# Both false with ``static:F`` is a plain static partition (the simulator's static baselines).
SWITCH_PARAMS = ("admission", "slo_preemption")


def colocation_switches(raw: Mapping[str, Any]) -> dict[str, bool]:
    """The engine switches of `SWITCH_PARAMS` in ``k=v`` config params (True when absent).

    Raises:
        ValueError: A value that is not a boolean.
    """
    switches = {}
    for name in SWITCH_PARAMS:
        try:
            switches[name] = parse_bool(raw.get(name, True), f"colocation param {name}")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return switches


def colocation_params(raw: Mapping[str, Any]) -> tuple[ColocationParams, str]:
    """`ColocationParams` and the system (``sage`` or ``spec``) from ``k=v`` config params
    (`SWITCH_PARAMS` are checked by `colocation_switches`).

    Values may be strings (flags, environment): each is converted to its field's type;
    ``priority_weights`` takes ``1/2/4``.

    Raises:
        ValueError: An unknown name (the message lists the known ones) or a bad value.
    """
    from engine_adapter.colocation import ColocationParams  # pure Python; only when asked

    known = ColocationParams.names()
    values: dict[str, Any] = {}
    system = "sage"
    defaults = ColocationParams()
    for name, value in raw.items():
        if name == SYSTEM_PARAM:
            system = str(value)
            if system not in ("sage", "spec"):
                raise ValueError(f"colocation param system={value!r}: must be sage or spec")
            continue
        if name in SWITCH_PARAMS:
            continue
        if name not in known:
            listed = ", ".join((*known, SYSTEM_PARAM, *SWITCH_PARAMS))
            raise ValueError(f"unknown colocation param {name!r}; known: {listed}")
        default = getattr(defaults, name)
        try:
            if isinstance(default, tuple):
                parts = value if isinstance(value, list | tuple) else str(value).replace("/", " ").split()
                values[name] = tuple(float(p) for p in parts)
            elif isinstance(default, int) and not isinstance(default, bool):
                values[name] = int(value)
            else:
                values[name] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"colocation param {name}={value!r}: not a {type(default).__name__}") from None
    return ColocationParams(**values), system


def parse_colocation_mode(value: Any, where: str) -> str:
    mode = parse_text(value, where).lower()
    if (
        not COLOCATION_MODE.match(mode)
        or mode in ("static:0", "static:1")
        or (mode.startswith("static:") and not 0.0 < float(mode.split(":", 1)[1]) < 1.0)
    ):
        raise fail(where, value, "off, dynamic or static:F with F in (0, 1)")
    return mode
