"""What the routers people put in front of engines call on their workers (docs/routers.md).

SGLang's router (``sglang-router``, continued as ``smg``) registers a worker by reading
``/server_info`` and ``/model_info`` (falling back to ``/get_server_info`` and ``/get_model_info``),
checks ``/health``, asks ``/get_load`` for the ``power_of_two`` policy, sends ``/flush_cache`` to
every worker on its own ``/flush_cache``, and forwards the OpenAI routes with its own request
schema, which adds SGLang's extension fields (``skip_special_tokens``, ``no_stop_trim`` ...) to
every chat body. The answers here are the engine's real state: the model the engine serves, its
block size and pool, its queue, and a flush that resets the prefix cache.

An extension field sage does not implement is accepted only at the value that means "do what an
OpenAI server does" (the router sends its defaults on every request); any other value is a 400,
so a client that asks for SGLang's behaviour is told it does not get it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine_adapter.serving.requests import ApiError, endpoint, json_response

__all__ = ["SGLANG_DEFAULTS", "WORKER_ROUTES", "drop_router_defaults"]

# SGLang's (and one vLLM) extension fields of chats and completions, and the value at which each
# changes nothing (their defaults, which their routers serialise into every forwarded body).
SGLANG_DEFAULTS: dict[str, Any] = {
    "continue_final_message": False,
    "include_reasoning": True,  # vLLM's (its router adds it to chats)
    "no_stop_trim": False,
    "return_hidden_states": False,
    "separate_reasoning": True,
    "skip_special_tokens": True,
    "stream_reasoning": True,
}


def drop_router_defaults(body: dict[str, Any], what: str) -> dict[str, Any]:
    """`body` without the SGLang extension fields that hold their neutral value (or null).

    Raises:
        ApiError: 400 when one asks for behaviour sage does not have.
    """
    kept = dict(body)
    for name, neutral in SGLANG_DEFAULTS.items():
        if name not in kept:
            continue
        value = kept.pop(name)
        if value is not None and value != neutral:
            raise ApiError(
                400,
                "unsupported_field",
                f"{what}: {name}={value!r} is an SGLang extension sage does not implement "
                f"(only {neutral!r}, its default, is accepted)",
            )
    return kept


class _Served(Protocol):
    """What these handlers read of the app's state (`app.AppState`, not imported: it imports this)."""

    engine: Any
    served_model: str


def _state(request: Request) -> _Served:
    state: _Served = request.app.state.sage
    return state


def _model_path(state: _Served) -> str:
    return state.served_model


@endpoint
async def server_info(request: Request) -> Response:
    """SGLang's ``/server_info``: the launch arguments a router reads (model, parallelism, page
    size), here the engine's own configuration."""
    state = _state(request)
    info = await asyncio.to_thread(state.engine.info)
    config = state.engine.config
    return json_response(
        {
            "model_path": _model_path(state),
            "served_model_name": _model_path(state),
            "tokenizer_path": _model_path(state),
            "tp_size": 1,
            "dp_size": 1,
            "page_size": info["block_size"],
            "max_total_num_tokens": info["num_blocks"] * info["block_size"],
            "max_running_requests": config.max_num_seqs,
            "eviction_policy": info["policy"]["name"],
            "kv_events_endpoint": config.kv_events_endpoint,
            "engine": "sage",
        }
    )


@endpoint
async def model_info(request: Request) -> Response:
    """SGLang's ``/model_info``."""
    state = _state(request)
    return json_response(
        {
            "model_path": _model_path(state),
            "tokenizer_path": _model_path(state),
            "is_generation": True,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "sage",
            "architectures": None,
            "weight_version": "default",
        }
    )


def _held_blocks(engine: Any) -> int:
    """Blocks requests hold: the pool less what is free or reclaimable (the prefix cache's
    unreferenced blocks are not load)."""
    with engine.cache.lock:
        held: int = engine.cache.num_blocks - engine.cache.num_available_blocks
        return held


@endpoint
async def get_load(request: Request) -> Response:
    """SGLang's ``/get_load`` (the ``power_of_two`` policy's signal): requests and tokens held."""
    engine = _state(request).engine
    usage = await asyncio.to_thread(engine.cache_usage)
    held = await asyncio.to_thread(_held_blocks, engine)
    return json_response(
        [
            {
                "dp_rank": 0,
                "num_reqs": usage["running"] + usage["waiting"],
                "num_waiting_reqs": usage["waiting"],
                "num_tokens": held * engine.config.block_size,
            }
        ]
    )


@endpoint
async def flush_cache(request: Request) -> Response:
    """SGLang's ``/flush_cache``: reset the prefix cache (blocks in use by running requests stay)."""
    freed = await asyncio.to_thread(_state(request).engine.reset_prefix_cache)
    return json_response({"status": "flushed", "freed_blocks": freed})


WORKER_ROUTES = [
    Route("/server_info", server_info, methods=["GET"]),
    Route("/get_server_info", server_info, methods=["GET"]),
    Route("/model_info", model_info, methods=["GET"]),
    Route("/get_model_info", model_info, methods=["GET"]),
    Route("/get_load", get_load, methods=["GET"]),
    Route("/flush_cache", flush_cache, methods=["POST", "GET"]),
]
