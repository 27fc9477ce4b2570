"""The parsed bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions``, and their answers.

`Completion` and `ChatCompletion` check a body field by field (OpenAI's fields that sage
serves, and sage's extensions: priority, tenant, cache_salt, ignore_eos, kv_compression, the
SLOs) and build the OpenAI-shaped answer, whole or as stream chunks; `usage` is the answer's
token counts. OpenAI's fields are all taken: applied (sampling, the penalties, seed, stop,
user as the tenant, the prompt-cache fields read by `prompt_cache`), or taken where sage serves
the value asked (``n: 1``, ``logprobs`` off, ``response_format: {"type": "text"}``, an empty
``logit_bias``); any other value is a 400 that names the field. A stream gives its usage once,
in a last chunk, only when ``stream_options.include_usage`` asks, as OpenAI's does. Without
``max_tokens`` a completion generates at most 16 tokens and a chat the rest of the context (what
the engine resolves once the messages are rendered): OpenAI's and vLLM's defaults, so a chat
answer is not cut short unasked.

Imports: the shared request handling (`requests`); the model's sampling and chat template and
token-level eviction's request record, inside the functions that need them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from engine_adapter.serving.prompt_cache import OPENAI_CACHE_FIELDS, CacheAsk, cache_counts, openai_cache_ask
from engine_adapter.serving.requests import (
    ApiError,
    bad_value,
    check_model,
    is_token_ids,
    opt_bool,
    opt_float,
    opt_int,
    opt_slo_ms,
    opt_str,
)

__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "ChatCompletion", "Completion", "sampling_params", "usage"]

# The top-level fields of POST /v1/completions: OpenAI's that we serve, and sage's extensions.
# Every field OpenAI's clients and frameworks send by default is here: a value sage applies
# (the penalties, seed, user) or can serve as asked (n=1, logprobs off, plain text) is taken, and
# any other value is a 400 that names the field.
COMPLETION_FIELDS = frozenset(
    {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
        "stream_options", "user", "n", "logprobs", "echo", "frequency_penalty", "presence_penalty",
        "logit_bias",
        "priority", "tenant", "cache_salt", "ignore_eos", "kv_compression", "slo_ttft_ms", "slo_tpot_ms",
    }
    | OPENAI_CACHE_FIELDS
)  # fmt: skip
CHAT_FIELDS = (COMPLETION_FIELDS - {"prompt", "echo"}) | {
    "messages", "max_completion_tokens", "response_format", "top_logprobs",
}  # fmt: skip


def _prompt(body: dict[str, Any]) -> str | list[int]:
    """`prompt`: a string or a list of token ids; a batch of exactly one of either is unwrapped."""
    if "prompt" not in body or body["prompt"] is None:
        raise ApiError(400, "invalid_value", "'prompt' is required: a string or a list of token ids")
    prompt = body["prompt"]
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and (isinstance(prompt[0], str) or is_token_ids(prompt[0]))
    ):
        prompt = prompt[0]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise bad_value("prompt", f"batches of prompts are not served ({len(prompt)} given); send one")
    if isinstance(prompt, str):
        if not prompt:
            raise bad_value("prompt", "must not be empty")
        return prompt
    if is_token_ids(prompt):
        if not prompt:
            raise bad_value("prompt", "must not be empty")
        if any(t < 0 for t in prompt):
            raise bad_value("prompt", "token ids must be >= 0")
        return list(prompt)
    raise bad_value("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")


def _stop(body: dict[str, Any]) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise bad_value("stop", f"must be a string or a list of strings, got {stop!r}")


def _kv_compression(value: Any) -> Any:
    """A request's ``kv_compression: {"policy": NAME, "ratio": R}`` (None when absent)."""
    from engine_adapter.token_eviction import KVCompression

    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"policy", "ratio"}:
        raise bad_value("kv_compression", f'must be {{"policy": NAME, "ratio": R}}, got {value!r:.80}')
    from engine_adapter.token_eviction.registry import token_policy_from_spec

    try:
        compression = KVCompression(value["policy"], value["ratio"])
        token_policy_from_spec(compression.policy)  # its params, checked now: a 400, not a failed step
        return compression
    except ValueError as exc:
        raise bad_value("kv_compression", str(exc).removeprefix("kv_compression.")) from None


def _check_served_as_asked(body: dict[str, Any]) -> None:
    """OpenAI's switches that sage serves only one way: that way is taken (n=1, no log
    probabilities, no echo, no logit bias, plain text), any other is a 400 naming the field."""
    n = opt_int(body, "n")
    if n is not None and n != 1:
        raise bad_value("n", f"only n=1 is served, got {n}")
    if body.get("logprobs") not in (None, 0):  # completions: an integer; chat: a boolean (False == 0)
        raise bad_value("logprobs", "log probabilities are not served; send null or false")
    if body.get("top_logprobs") not in (None, 0) or isinstance(body.get("top_logprobs"), bool):
        raise bad_value("top_logprobs", "log probabilities are not served; send null or 0")
    if opt_bool(body, "echo", False):
        raise bad_value("echo", "echo is not served; send false")
    bias = body.get("logit_bias")
    if bias is not None and bias != {}:
        raise bad_value("logit_bias", f"a logit bias is not served; send null or {{}}, got {bias!r:.80}")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        shown = repr(kind) if isinstance(kind, str) and kind != "text" else f"{response_format!r:.80}"
        raise bad_value("response_format", f'only {{"type": "text"}} is served, got {shown}')


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    """`stream_options`: whether the stream ends with a usage chunk (OpenAI's include_usage).

    ``include_obfuscation`` is taken and has nothing to do: sage pads no event."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        expected = '{"include_usage": bool, "include_obfuscation": bool}'
        raise bad_value("stream_options", f"must be {expected}, got {options!r:.80}")
    if not stream:
        raise bad_value("stream_options", "only allowed with stream=true")
    opt_bool(options, "include_obfuscation", False)
    return opt_bool(options, "include_usage", False)


def _sampling_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The body's sampling fields as `SamplingParams` keywords (its own checks name the field)."""
    sampling: dict[str, Any] = {}
    max_tokens = opt_int(body, "max_tokens", minimum=1)
    newer = opt_int(body, "max_completion_tokens", minimum=1)  # checked even beside max_tokens
    if max_tokens is None:  # the chat API's newer name
        max_tokens = newer
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    for field in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        value = opt_float(body, field)
        if value is not None:
            sampling[field] = value
    top_k = opt_int(body, "top_k", minimum=-1)
    if top_k is not None:
        sampling["top_k"] = max(top_k, 0)  # vLLM's -1 and sage's 0 both mean "no top-k"
    stop = _stop(body)
    if stop is not None:
        sampling["stop"] = stop
    seed = opt_int(body, "seed")
    if seed is not None:
        sampling["seed"] = seed
    if opt_bool(body, "ignore_eos", False):  # vLLM's extension: benchmarks fix output lengths
        sampling["ignore_eos"] = True
    return sampling


def sampling_params(kwargs: dict[str, Any]) -> Any:
    """`SamplingParams` of checked keywords; a value it refuses is a 400 with its message."""
    from engine_adapter.model.sampling import SamplingParams

    try:
        return SamplingParams(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_value", str(exc)) from None


class Completion:
    """A parsed POST /v1/completions body."""

    is_chat = False  # its prompt is a string or token ids
    object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        self.model = check_model(body, served_model)
        self.prompt: Any = self._read_prompt(body)
        _check_served_as_asked(body)
        self.stream = opt_bool(body, "stream", False)
        self.include_usage = _include_usage(body, self.stream)
        self.sampling_kwargs = _sampling_kwargs(body)
        self.user = opt_str(body, "user")
        self.priority = opt_int(body, "priority") or 0
        tenant = opt_str(body, "tenant")
        self.tenant = tenant if tenant is not None else self.user
        self.cache_salt = opt_str(body, "cache_salt")
        if self.cache_salt == "":
            raise bad_value("cache_salt", "must not be empty; leave it out for no salt")
        self.kv_compression = _kv_compression(body.get("kv_compression"))
        # prompt_cache_key, _retention, _options, the parts' breakpoints (docs/concepts/prompt-caching.md)
        self.cache_ask: CacheAsk = openai_cache_ask(body)
        # SLO extensions (spec 004); None: the tenant's default from the engine config.
        self.slo_ttft_ms = opt_slo_ms(body, "slo_ttft_ms")
        self.slo_tpot_ms = opt_slo_ms(body, "slo_tpot_ms")
        self.request_id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _read_prompt(self, body: dict[str, Any]) -> Any:
        return _prompt(body)

    def sampling_params(self) -> Any:
        return sampling_params(self.sampling_kwargs)

    def _envelope(self, object_name: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, **choice, "logprobs": None}],
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """One server-sent event's object."""
        return self._envelope(self.object_name, {"text": text, "finish_reason": finish_reason})

    def answer(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """The whole answer of a request that does not stream."""
        return self.chunk(text, finish_reason)

    def stream_chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """A chunk of the stream: with ``include_usage`` it carries ``"usage": null``, as each
        of OpenAI's does before the last."""
        chunk = self.chunk(text, finish_reason)
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def usage_chunk(self, output: Any) -> dict[str, Any]:
        """The stream's last chunk with ``include_usage``: no choices, the request's usage."""
        return {
            "id": self.request_id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(output),
        }


class ChatCompletion(Completion):
    """A parsed POST /v1/chat/completions body: the same fields as a completion, with messages
    instead of a prompt; the engine renders them with the model's chat template."""

    is_chat = True  # its prompt is messages, rendered with the chat template
    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl"

    def __init__(self, body: dict[str, Any], served_model: str) -> None:
        super().__init__(body, served_model)
        self._role_sent = False

    def _read_prompt(self, body: dict[str, Any]) -> Any:
        from engine_adapter.model.chat_template import ChatTemplateError, parse_messages

        try:
            return parse_messages(body.get("messages"))
        except ChatTemplateError as exc:
            raise bad_value("messages", str(exc)) from None

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {"content": text} if text or finish_reason is None else {}
        if not self._role_sent:  # OpenAI's first delta names the role
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return self._envelope(self.object_name, {"delta": delta, "finish_reason": finish_reason})

    def answer(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return self._envelope("chat.completion", {"message": message, "finish_reason": finish_reason})


def usage(output: Any) -> dict[str, Any]:
    """OpenAI's usage: read tokens as ``cached_tokens``, written ones as ``cache_write_tokens``
    (the name OpenAI's client gives them), and sage's extensions beside them."""
    prompt_tokens = int(output.prompt_tokens)
    completion_tokens = int(output.completion_tokens)
    counts = cache_counts(output)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": counts.read,
            # of those, from a prefix compressed instead of evicted (--compress-on-evict)
            "compressed_cached_tokens": int(getattr(output, "compressed_cached_tokens", 0)),
            "cache_write_tokens": counts.written,
            # sage's extension: the minimum lifetime granted to what it wrote (null: none)
            "cache_ttl_s": counts.ttl_s,
        },
    }
