"""The value parsers of the engine's config: ``(value, where) -> value``, one per kind of key.

Each takes what a source gives (a string from a flag or the environment, a YAML scalar or
mapping, a Python value in code) and returns the key's value, or raises `ConfigError` naming
`where` (``--num-blocks``, ``SAGE_NUM_BLOCKS``, ``config file x.yaml: num_blocks``) and the
value. `engine_adapter.serving.config.engine_config.PARSERS` says which key takes which.

Imports: the standard library, `engine_adapter.cache.sizes`, `engine_adapter.paths`,
`engine_adapter.safe_yaml`; the token policies' names only when a token policy is parsed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine_adapter.cache.sizes import parse_bytes
from engine_adapter.paths import is_engine_name
from engine_adapter.safe_yaml import shorten

__all__ = [
    "DEVICE",
    "ENGINE_KINDS",
    "ConfigError",
    "Parser",
    "check_device",
    "fail",
    "float_in",
    "int_at_least",
    "parse_bool",
    "parse_device",
    "parse_engine_kind",
    "parse_engine_name",
    "parse_host",
    "parse_model",
    "parse_params",
    "parse_path",
    "parse_policy",
    "parse_port",
    "parse_secret",
    "parse_size",
    "parse_text",
    "parse_token_policy",
    "parse_zmq_endpoint",
]

ENGINE_KINDS = ("llm",)
DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")

Parser = Callable[[Any, str], Any]


class ConfigError(ValueError):
    """A config value, key or file that cannot be used; the message names it and its source."""


def fail(where: str, value: Any, expected: str) -> ConfigError:
    """The error for `value` at `where`, which is not `expected` (the value shortened)."""
    return ConfigError(f"{where}: {shorten(value)} is not {expected}")


def parse_text(value: Any, where: str) -> str:
    """A non-empty string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise fail(where, value, "a non-empty string")
    return value.strip()


def parse_model(value: Any, where: str) -> str:
    """A model name or path (the loader checks it at start)."""
    return parse_text(value, where)


def parse_engine_kind(value: Any, where: str) -> str:
    """One of `ENGINE_KINDS`."""
    kind = parse_text(value, where).lower()
    if kind not in ENGINE_KINDS:
        raise ConfigError(
            f"{where}: engine kind {shorten(value)} is not supported; supported: {', '.join(ENGINE_KINDS)}"
        )
    return kind


def parse_policy(value: Any, where: str) -> str:
    """A policy name, lower-cased (`EngineConfig.check_policy` checks it against the registry)."""
    return parse_text(value, where).lower()


def parse_preemption_order(value: Any, where: str) -> str:
    """``policy`` or a name in `sage_eviction.preemption.ORDERS` (a plugin's included), lower-cased."""
    from sage_eviction.preemption import resolve_order

    name = parse_text(value, where).lower()
    try:
        resolve_order(name)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return name


def parse_token_policy(value: Any, where: str) -> str:
    """A token-level policy of `engine_adapter.token_eviction`: a name, or ``name:k=v,...``
    (``adakv:snapkv``). A name is checked without torch; a spec with params is built once here
    (importing torch) so that a bad param fails the config, not the engine's start."""
    from engine_adapter.token_eviction.registry import (
        TokenPolicyParamError,
        UnknownTokenPolicyError,
        parse_token_spec,
        token_policy_from_spec,
        token_policy_names,
    )

    spec = parse_text(value, where).lower()
    try:
        if parse_token_spec(spec)[1]:
            token_policy_from_spec(spec)
    except UnknownTokenPolicyError:
        raise ConfigError(
            f"{where}: token eviction policy {shorten(value)} is not one of {', '.join(token_policy_names())}"
        ) from None
    except TokenPolicyParamError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return spec


def parse_compress_on_evict(value: Any, where: str) -> str:
    """``PRESS:RATIO`` for compress-on-evict (``knorm:0.75``), or "" (off): the press is built
    once here (importing torch: only when one is given) and must be query-agnostic, so a bad one
    fails the config."""
    if value is None or value == "":
        return ""
    from engine_adapter.cache.compressed import parse_compress_spec
    from engine_adapter.serving.prefix_compression import compress_press

    spec = parse_text(value, where).strip().lower()
    try:
        compress_press(parse_compress_spec(spec))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return spec


# The model's choices (engine_adapter.model.precision holds the same; a test keeps them equal):
# spelt here so that reading a config never imports torch.
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "int4")
PACKED_WEIGHTS = ("auto", "on", "off")
BATCH_INVARIANT = ("auto", "on", "off")
# When a block reaches the host KV tier (SGLang HiCache's names): on eviction, or on commit.
WRITE_POLICIES = ("write_back", "write_through")


def one_of(choices: tuple[str, ...], what: str) -> Parser:
    """A parser of one of `choices` (case-insensitive)."""

    def parse(value: Any, where: str) -> str:
        text = value.strip().lower() if isinstance(value, str) else value
        if text not in choices:
            raise fail(where, value, f"a {what}: {', '.join(choices)}")
        return str(text)

    return parse


def check_device(device: str) -> None:
    """A CUDA device that this torch cannot reach is refused up front, in one line (torch's own
    "Torch not compiled with CUDA enabled" is an AssertionError deep in the model's load).

    Raises:
        ConfigError: ``cuda`` or ``cuda:N`` on a CPU-only torch, with no GPU visible, or N
            beyond the GPUs.
    """
    if not device.startswith("cuda"):
        return
    import torch

    where = f"--device {device}"
    if torch.version.cuda is None:
        raise ConfigError(
            f"{where}: this torch ({torch.__version__}) is a CPU-only build; use --device cpu "
            "(or auto), or install a CUDA build of torch"
        )
    count = torch.cuda.device_count()
    if int(device.partition(":")[2] or 0) >= count:
        seen = f"{count} CUDA GPU{'s' if count != 1 else ''} visible" if count else "no CUDA GPU visible"
        raise ConfigError(f"{where}: {seen}; use --device cpu (or auto)")


def parse_device(value: Any, where: str) -> str:
    """auto, cpu, cuda or cuda:N."""
    device = parse_text(value, where).lower()
    if not DEVICE.match(device):
        raise fail(where, value, "a device: auto, cpu, cuda or cuda:N")
    return device


def parse_engine_name(value: Any, where: str) -> str:
    """A name that can name an engine's files (`engine_adapter.paths.is_engine_name`)."""
    name = parse_text(value, where)
    if not is_engine_name(name):
        raise fail(where, value, "an engine name: up to 64 letters, digits, '.', '_' or '-'")
    return name


def parse_path(value: Any, where: str) -> str:
    """An absolute path (``~`` expanded), or "" for the default."""
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        raise fail(where, value, "a path")
    if not value:
        return ""
    return os.path.abspath(os.path.expanduser(value))


def parse_bool(value: Any, where: str) -> bool:
    """A boolean, or true/false, 1/0, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
    raise fail(where, value, "a boolean (true/false, 1/0, yes/no, on/off)")


def int_at_least(minimum: int) -> Callable[[Any, str], int]:
    """The parser of whole numbers (or their strings) no smaller than `minimum`."""

    def convert(value: Any, where: str) -> int:
        if isinstance(value, bool):
            raise fail(where, value, "an integer")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise fail(where, value, "an integer") from None
        if not isinstance(value, int):
            raise fail(where, value, "an integer")
        if value < minimum:
            raise ConfigError(f"{where}: {value} is below the minimum {minimum}")
        return value

    return convert


def float_in(low: float, high: float | None, *, low_open: bool) -> Callable[[Any, str], float]:
    """The parser of numbers in [low, high] (or (low, high] with `low_open`; no upper bound when
    `high` is None)."""

    def convert(value: Any, where: str) -> float:
        if isinstance(value, bool):
            raise fail(where, value, "a number")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise fail(where, value, "a number") from None
        if not isinstance(value, int | float) or value != value:
            raise fail(where, value, "a number")
        x = float(value)
        below = x <= low if low_open else x < low
        if below or (high is not None and x > high):
            bracket = "(" if low_open else "["
            upper = f"{high:g}]" if high is not None else "inf)"
            raise ConfigError(f"{where}: {shorten(value)} is not in {bracket}{low:g}, {upper}")
        return x

    return convert


def parse_size(value: Any, where: str) -> int:
    """A positive number of bytes, or a size such as ``2GiB``."""
    if isinstance(value, float) and not value.is_integer():
        raise fail(where, value, "a whole number of bytes")
    try:
        size = parse_bytes(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if size <= 0:
        raise ConfigError(f"{where}: {shorten(value)} is not a positive size")
    return size


def parse_host(value: Any, where: str) -> str:
    """A host name or IP address to listen on."""
    if not isinstance(value, str) or any(c.isspace() or c in "/[]" for c in value.strip()):
        raise fail(where, value, "a host name or IP address")
    return value.strip()


def parse_port(value: Any, where: str) -> int:
    """A TCP port, 1..65535."""
    port = int_at_least(1)(value, where)
    if port > 65535:
        raise ConfigError(f"{where}: {port} is not a TCP port (1..65535)")
    return port


def parse_secret(value: Any, where: str) -> str:
    """An API key: printable, no spaces, 16 characters at least (never echoed)."""
    # Never echo the value: it is a credential.
    if not isinstance(value, str) or any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{where}: not a usable API key (printable, no spaces)")
    if value and len(value) < 16:
        raise ConfigError(f"{where}: an API key of {len(value)} characters is too short (16 at least)")
    return value


def parse_params(value: Any, where: str) -> dict[str, Any]:
    """A mapping (YAML, JSON), a list of ``k=v`` (repeated flags) or ``"k=v,k=v"`` (env)."""
    if isinstance(value, str):
        value = [item for item in (p.strip() for p in value.split(",")) if item]
    if isinstance(value, list | tuple):
        params: dict[str, Any] = {}
        for item in value:
            key, eq, raw = str(item).partition("=")
            if not eq or not key.strip():
                raise fail(where, item, "of the form k=v")
            if key.strip() in params:
                raise ConfigError(f"{where}: param {shorten(key.strip())} is given twice")
            params[key.strip()] = raw.strip()
        return params
    if isinstance(value, Mapping):
        params = {}
        for key, raw in value.items():
            if not isinstance(key, str) or not key:
                raise fail(where, key, "a param name")
            if raw is not None and not isinstance(raw, str | int | float | bool):
                raise fail(f"{where}.{key}", raw, "a string, number or boolean")
            params[key] = raw
        return params
    raise fail(where, value, "a mapping of params, or k=v items")


def parse_zmq_endpoint(value: Any, where: str) -> str:
    """A ZMQ endpoint to bind (tcp://HOST:PORT, ipc://PATH or inproc://NAME), or "" for none."""
    if not isinstance(value, str) or any(c.isspace() for c in value):
        raise fail(where, value, "a ZMQ endpoint such as tcp://127.0.0.1:5557")
    if not value:
        return ""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise fail(where, value, "a ZMQ endpoint such as tcp://127.0.0.1:5557")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise fail(where, value, "tcp://HOST:PORT with a port 1..65535")
    return value
