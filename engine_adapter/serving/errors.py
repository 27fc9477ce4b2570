"""What the engine raises at a caller: a request it refuses, and an engine that takes no more.

    ValueError
    └── RequestError            a request that can never be served: a 400
    RuntimeError
    ├── EngineClosedError       the engine is draining or stopped: a 503
    └── AdmissionRejected       colocation's admission control rejected it: a 429

The control API (`engine_adapter.serving.app`) maps each to its status; their messages are the
answers' messages. A failure inside the engine loop is no exception at the caller: the request
ends with ``finish_reason`` "error" (docs/architecture.md, "Errors").

Imports: nothing (the app imports this module without the engine, which imports torch).
"""

from __future__ import annotations

__all__ = ["AdmissionRejected", "EngineClosedError", "RequestError"]


class RequestError(ValueError):
    """A request that can never be served (empty prompt, too long for the pool, bad values)."""


class EngineClosedError(RuntimeError):
    """The engine is draining or stopped and takes no new request."""


class AdmissionRejected(RuntimeError):
    """Colocation's admission control rejected the request (the message is its reason): a 429."""
