"""A trace request's prompt-cache contract (issue 51): its fields, their checks, and salted keys.

The Mooncake JSON-lines format carries, per request and all optional (docs/reference/simulator.md,
"Prompt-cache contracts"): `cache_salt` (an isolation key: requests with different salts never
share a block, on any tier), `cache_ttl_s` (the minimum lifetime asked for the blocks the request
writes or hits, each hit refreshing it: OpenAI's ``prompt_cache_retention`` / ``ttl``,
Anthropic's ``cache_control.ttl``) and `cache_breakpoint` (explicit mode: only the prompt's first
`cache_breakpoint` tokens are written to the cache). The session key the engine records is the
format's `session`. These are the fields of the engine's `CacheContract`; the radix cache model
hands them to the same `CacheManager` the engine runs (`engine_adapter.sim.contract_model`), so
their semantics are the engine's, not a second copy.

A salt is applied where the keys are read: a salted request's keys are `salted_keys(salt,
hash_ids)`, 63-bit integers hashed from the salt and each id (Mooncake's ids are prefix-chained
already, so equal salted keys still mean the same prefix), so every cache model, the compiled
loops too, sees isolated keys, as the engine's keys chain from a salted root
(`engine_adapter.cache.block_keys.root_key`).

Pure Python; imports only the trace-file error and value formatter.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

from engine_adapter.sim.trace_file import WorkloadError, shown

__all__ = ["CONTRACT_FIELDS", "ContractFields", "contract_fields", "salted_keys"]

CONTRACT_FIELDS = ("cache_salt", "cache_ttl_s", "cache_breakpoint")
"""The optional fields a trace line may carry (module docstring)."""

ContractFields = tuple["str | None", "float | None", "int | None"]
"""A request's salt, lifetime (s) and breakpoint (tokens), each None when not given."""


def salted_keys(salt: str, keys: Sequence[int]) -> list[int]:
    """`keys` isolated under `salt`: each a non-negative 63-bit integer hashed from the salt and the
    key (stable across processes; an int64, so the compiled loops keep their C key sets)."""
    prefix = b"sage/sim-salt/" + salt.encode("utf-8") + b"\0"
    blake = hashlib.blake2b
    return [
        int.from_bytes(blake(prefix + str(key).encode(), digest_size=8).digest(), "little") >> 1
        for key in keys
    ]


def contract_fields(record: Mapping[str, object], input_len: int, where: str) -> ContractFields:
    """The contract fields of a trace record, checked: a bad one is a one-line `WorkloadError`
    ``where: 'field' ...`` naming the field."""
    salt = record.get("cache_salt")
    if salt is not None and (type(salt) is not str or not salt):
        raise WorkloadError(f"{where}: 'cache_salt' must be a non-empty string or null, got {shown(salt)}")
    asked = record.get("cache_ttl_s")
    ttl = None
    if asked is not None:
        if (
            not isinstance(asked, int | float)
            or type(asked) is bool
            or not math.isfinite(asked)
            or asked <= 0
        ):
            raise WorkloadError(
                f"{where}: 'cache_ttl_s' must be a positive number of seconds or null, got {shown(asked)}"
            )
        ttl = float(asked)
    breakpoint_ = record.get("cache_breakpoint")
    if breakpoint_ is not None and (
        not isinstance(breakpoint_, int) or type(breakpoint_) is bool or not 0 <= breakpoint_ <= input_len
    ):
        raise WorkloadError(
            f"{where}: 'cache_breakpoint' must be an integer of tokens within [0, input_length={input_len}] "
            f"or null, got {shown(breakpoint_)}"
        )
    return salt, ttl, breakpoint_
