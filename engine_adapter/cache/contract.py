"""`CacheContract`: what a request asked of the prompt cache, in the providers' terms.

OpenAI's `prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options` and
`prompt_cache_breakpoint`, and Anthropic's `cache_control` (on blocks and at the top level), all
come down to the same three things the cache core acts on: a session the request belongs to
(routing and accounting, never isolation: that is `cache_salt`), a minimum lifetime for the
blocks it writes (served by demotion to a lower tier, not by pinning device memory), and how
much of its prompt it writes at all (explicit mode: only up to the last breakpoint). The server
parses the wire fields into this record; the scheduler hands it to the cache with the request.
This module imports nothing of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheContract", "CacheReceipt"]


@dataclass(frozen=True, slots=True)
class CacheContract:
    """A request's prompt-cache contract.

    Attributes:
        session_key: The client's session key (`prompt_cache_key`, Anthropic's
            `metadata.user_id`); recorded with the request and its blocks, never an isolation
            key.
        ttl_s: The minimum lifetime, in seconds, asked for the blocks this request writes or
            hits (each hit refreshes it); None: no retention (`in_memory`, today's behaviour).
        write_tokens: Explicit mode: write only the prompt's first `write_tokens` tokens (up to
            the last breakpoint) to the cache; None: the whole prompt (implicit mode).
        short_ttl: ``(tokens, ttl_s)``: past its first `tokens` prompt tokens the lifetime is
            this shorter one (Anthropic's ``"1h"`` blocks before ``"5m"`` ones: the prompt up
            to the last ``"1h"`` block keeps an hour, the rest five minutes); None: one lifetime.
    """

    session_key: str | None = None
    ttl_s: float | None = None
    write_tokens: int | None = None
    short_ttl: tuple[int, float] | None = None


@dataclass(slots=True)
class CacheReceipt:
    """What the cache did for one request, filled in by the cache while it runs (its usage).

    The caller creates one per request and hands it with every `CacheRequest` of it (a
    preempted request is admitted again with the same receipt).

    Attributes:
        prompt_tokens: The request's prompt length (a re-admission's tokens include its output).
        written_tokens: Prompt tokens this request newly wrote to the prefix cache: whole
            blocks (the partial last block is never cached), each position counted once and
            never one it read at its first admission (a block written again after a preemption
            counts once), so ``written_tokens + cached tokens <= prompt tokens``.
        counted_upto: Prompt block positions below this are counted or were read (-1: not
            admitted yet).
        retention_ttl_s: The lifetime granted (the ask bounded by `--max-cache-ttl`); 0.0 when
            some of its blocks were refused retention (no lower tier, the device share full);
            None: none asked.
        written_short_tokens: Of `written_tokens`, those past the contract's `short_ttl` point
            (retained for the shorter lifetime).
    """

    prompt_tokens: int
    written_tokens: int = 0
    written_short_tokens: int = 0
    counted_upto: int = -1
    retention_ttl_s: float | None = None
