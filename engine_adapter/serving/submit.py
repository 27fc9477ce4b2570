"""Submitting a parsed generation request to the engine, for every API that generates text.

OpenAI's completions and chat completions (`completion_requests`) and Anthropic's messages
(`messages`) parse their bodies into objects of one shape (`Submission`); this module renders a
chat with the model's template, turns the request's prompt-cache asks into its `CacheContract`
(`prompt_cache.cache_contract`), submits it, and maps the engine's refusals and failures to an
`ApiError` each API answers in its own error shape.

Imports: the shared request handling, the prompt-cache fields and the engine's errors; the
engine itself only as a type.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from engine_adapter.serving.errors import AdmissionRejected, EngineClosedError, RequestError
from engine_adapter.serving.prompt_cache import CacheAsk, cache_contract
from engine_adapter.serving.requests import ApiError, is_token_ids
from engine_adapter.serving.streams import call_in_daemon_thread

if TYPE_CHECKING:
    from engine_adapter.serving.engine import Engine

__all__ = ["Submission", "final_output", "submit"]


class Submission(Protocol):
    """A parsed generation request, whichever API it came through."""

    is_chat: bool  # `prompt` is a list of ChatMessage, rendered with the chat template
    prompt: Any
    sampling_kwargs: dict[str, Any]
    priority: int
    tenant: str | None
    cache_salt: str | None
    cache_ask: CacheAsk
    request_id: str
    kv_compression: Any
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None

    def sampling_params(self) -> Any: ...


def _submit(engine: Engine, request: Submission, sampling: Any) -> Any:
    prompt = request.prompt
    prompt_ids = prompt if is_token_ids(prompt) else None
    if request.is_chat:  # rendered and tokenised here, with its text marks
        prompt = engine.chat_tokenised(prompt)
        prompt_ids = prompt.ids
        if "max_tokens" not in request.sampling_kwargs:  # OpenAI's chat default: the rest of the context
            sampling = dataclasses.replace(sampling, max_tokens=engine.rest_of_context(len(prompt_ids)))
    contract = cache_contract(
        request.cache_ask,
        prompt_ids,
        lambda prefix: engine.chat_prompt(prefix, add_generation_prompt=False),
    )
    return engine.submit(
        prompt,
        sampling,
        priority=request.priority,
        tenant=request.tenant,
        cache_salt=request.cache_salt,
        cache_contract=contract,
        request_id=request.request_id,
        kv_compression=request.kv_compression,
        slo_ttft_ms=request.slo_ttft_ms,
        slo_tpot_ms=request.slo_tpot_ms,
    )


async def submit(engine: Engine, admits_requests: bool, request: Submission) -> Any:
    """Submit `request`; its `RequestHandle`.

    Raises:
        ApiError: 400 when it can never be served, 503 while the engine drains, 429 when
            admission control refuses it.
    """
    sampling = request.sampling_params()
    if not admits_requests:
        raise ApiError(503, "unavailable", "the engine is shutting down and admits no new requests")
    try:
        return await asyncio.to_thread(_submit, engine, request, sampling)
    except RequestError as exc:  # it can never be served
        raise ApiError(400, "invalid_request", str(exc)) from None
    except EngineClosedError as exc:  # it began draining between the check and the submit
        raise ApiError(503, "unavailable", str(exc)) from None
    except AdmissionRejected as exc:  # colocation's admission control: the reason is the message
        raise ApiError(429, "slo_rejected", str(exc)) from None


async def final_output(handle: Any, request_id: str) -> Any:
    """The request's final `RequestOutput`, awaited without blocking the event loop.

    Raises:
        ApiError: 500 when the engine failed on it, 429 when colocation deferred it and then
            found no room within its slack.
    """
    output = await call_in_daemon_thread(handle.result, f"sage-wait-{request_id}")
    if output.finish_reason == "error":
        raise ApiError(500, "engine_error", output.error or "the engine failed on this request")
    if output.finish_reason == "rejected":
        raise ApiError(429, "slo_rejected", output.error or "rejected by admission control")
    return output
