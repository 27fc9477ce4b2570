"""The fleet's routers by name, and ``name:k=v`` router specs read and checked.

`parse_router("cache_aware:cache_threshold=0.3")` gives the name and the converted params;
`split_router_specs` splits a ``--router`` list, where a ``k=v`` item after a spec is one more
param of it (``cache_aware:cache_threshold=0.3,balance_abs_threshold=8,precise`` is two
routers). Bad specs raise `RouterError` (one line, naming the routers or the params).
"""

from __future__ import annotations

from typing import Any

from engine_adapter.sim.fleet.cache_aware import CacheAware
from engine_adapter.sim.fleet.least_load import LeastLoad
from engine_adapter.sim.fleet.precise import Precise
from engine_adapter.sim.fleet.predicted_ttft import PredictedTTFT
from engine_adapter.sim.fleet.round_robin import RoundRobin
from engine_adapter.sim.fleet.router import Router, RouterError
from sage_eviction.registry import split_specs

__all__ = ["ROUTERS", "parse_router", "router_class", "split_router_specs"]

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (RoundRobin, LeastLoad, CacheAware, Precise, PredictedTTFT)
}


def router_class(name: str) -> type[Router]:
    cls = ROUTERS.get(name)
    if cls is None:
        raise RouterError(f"unknown router {name!r}; routers: {', '.join(ROUTERS)}")
    return cls


def parse_router(spec: str) -> tuple[str, dict[str, Any]]:
    """``name`` or ``name:k=v,...`` -> (name, params converted to their types)."""
    name, _, rest = spec.partition(":")
    cls = router_class(name.strip())
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise RouterError(f"router spec {spec!r}: {item!r} is not of the form k=v")
        param = cls.PARAMS.get(key)
        if param is None:
            listing = ", ".join(f"{k}={p.default}" for k, p in cls.PARAMS.items()) or "none"
            raise RouterError(f"router {cls.name!r} has no param {key!r}; params: {listing}")
        try:
            value = param.kind(raw.strip())
        except ValueError:
            raise RouterError(
                f"router {cls.name!r}: {key}={raw.strip()!r} is not {param.kind.__name__}"
            ) from None
        if not param.check(value):
            raise RouterError(f"router {cls.name!r}: {key}={value!r} must be {param.accepts}")
        params[key] = value
    return cls.name, params


def split_router_specs(text: str) -> list[str]:
    """``a,b:k=v,k2=v2,c`` -> ``["a", "b:k=v,k2=v2", "c"]``, each checked; duplicates dropped."""
    specs = split_specs(text)
    if not specs:
        raise RouterError(f"--router {text!r}: give router names, e.g. round_robin,precise")
    for spec in specs:
        parse_router(spec)
    return list(dict.fromkeys(specs))
